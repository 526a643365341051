// Greedy picks of a batched decode step: the argmax of each of n logits rows in one launch (a
// block a row) and one copy of the n indices to the host, instead of n launch + copy + sync
// round trips. Per row it is argmax_kernel's scan and tie rule (rowops.cu): a thread keeps the
// first of its strided maxima, the reductions keep the lower index of equal values, so the
// index equals Backend.argmax's.
#include "common.cuh"

__global__ void __launch_bounds__(1024) argmax_rows_kernel(const float *x, int cols, int *out) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  const float *row = x + (size_t)blockIdx.x * cols;
  float v = -INFINITY;
  int idx = cols;  // "none yet": loses every tie
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float t = row[j];
    if (t > v || idx == cols) { v = t; idx = j; }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { bv[warp] = v; bi[warp] = idx; }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    v = lane < nw ? bv[lane] : -INFINITY;
    idx = lane < nw ? bi[lane] : cols;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
    }
    if (lane == 0) out[blockIdx.x] = idx < cols ? idx : 0;
  }
}

extern "C" {

// hostOut[i] = argmax of row i of x [n, cols] (f32), for i < n. devOut: n ints of device memory
// (the caller's scratch). Runs whatever a recorded step holds first (a read), then waits.
HG_EXPORT int hg_cu_argmax_rows(HgCtx *c, const float *x, int n, int cols, int *devOut, int *hostOut) {
  HG_FLUSH(c);
  if (n <= 0 || cols <= 0) return (int)cudaErrorInvalidValue;
  argmax_rows_kernel<<<(unsigned)n, 1024, 0, c->compute>>>(x, cols, devOut);
  int r = hg_launched();
  if (r) return r;
  cudaError_t e = cudaMemcpyAsync(hostOut, devOut, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost, c->compute);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->compute);
  return (int)e;
}

}  // extern "C"
