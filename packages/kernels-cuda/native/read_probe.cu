// Read-bandwidth probes (CudaBackend.readBandwidth, device/read-probe.ts): how fast this GPU
// streams a large buffer into the SMs with no arithmetic, by plain 16-byte loads (mode 0) or by
// the weight-stream GEMV's structure — one block an SM, a producer thread issuing cp.async.bulk
// copies of slotKb into a shared-memory ring of ringKb, 8 consumer warps that only hand the slots
// back (mode 1). Why: the decode GEMVs stream at 3.1–4.0 TB/s in a step graph against a
// 4.25 TB/s copy; these say which part of the gap is the memory system and which the GEMV.
#include "mbarrier.cuh"

static const int RP_NW = 8, RP_THREADS = (RP_NW + 1) * 32;

// Mode 0: every 16-byte piece loaded once (grid-stride, 4 in flight a thread); the XOR of all
// of them is written only if it equals a value it never takes, so the loads are not dropped.
__global__ void read_ldg_kernel(const uint4 *p, size_t n, unsigned *sink) {
  unsigned acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Mode 1: block b streams bytes [B·b/G, B·(b+1)/G) (16-byte aligned) in slots of `slot` bytes,
// slot i of the block to consumer warp i % RP_NW, each warp owning spw slots used in turn.
__global__ void __launch_bounds__(RP_THREADS, 1) read_bulk_kernel(const char *p, size_t bytes, int slot, int spw) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int ns = RP_NW * spw;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + ns;
  unsigned char *ring = smem + (((size_t)2 * ns * 8 + 127) & ~(size_t)127);
  const size_t b0 = (bytes * blockIdx.x / gridDim.x) & ~(size_t)15, b1 = (bytes * (blockIdx.x + 1) / gridDim.x) & ~(size_t)15;
  const long pieces = (long)((b1 - b0 + slot - 1) / slot);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ns; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 1); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == RP_NW) {  // the producer
    if (lane == 0)
      for (long i = 0; i < pieces; i++) {
        const int w = (int)(i % RP_NW);
        const long t = i / RP_NW;  // the warp's t-th piece
        const int s = w * spw + (int)(t % spw);
        if (t >= spw) mbar_wait(&empty[s], (unsigned)((t / spw - 1) & 1));
        const size_t at = b0 + (size_t)i * slot;
        const unsigned n = (unsigned)(b1 - at < (size_t)slot ? b1 - at : (size_t)slot);
        mbar_expect_tx(&full[s], n);
        bulk_copy(ring + (size_t)s * slot, p + at, n, &full[s]);
      }
    return;
  }
  if (lane != 0) return;
  for (long i = warp, t = 0; i < pieces; i += RP_NW, t++) {
    const int s = warp * spw + (int)(t % spw);
    mbar_wait(&full[s], (unsigned)((t / spw) & 1));
    mbar_arrive(&empty[s]);
  }
}

extern "C" {

// Bytes read per second streaming `bytes` (a multiple of 16, 16-byte aligned) at src, `iters`
// times after one warm-up; mode 0 plain loads, mode 1 the bulk-copy ring (slotKb 4–32, ringKb
// 32–192; sm_90 only). The sink is an int of the misc area.
HG_EXPORT int hg_cu_read_bandwidth(HgCtx *c, const void *src, double bytes, int mode, int slotKb, int ringKb, int iters, double *bytesPerSecond) {
  HG_FLUSH(c);
  const size_t n = (size_t)bytes;
  if (n == 0 || n % 16 || ((uintptr_t)src & 15) || iters < 1 || (mode != 0 && mode != 1)) return (int)cudaErrorInvalidValue;
  const int slot = slotKb * 1024, spw = slotKb > 0 ? ringKb / (RP_NW * slotKb) : 0;
  const size_t smem = (((size_t)2 * RP_NW * spw * 8 + 127) & ~(size_t)127) + (size_t)RP_NW * spw * slot;
  if (mode == 1) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device);
    if (major < 9 || slotKb < 4 || slotKb > 32 || spw < 1 || smem > 227 * 1024) return (int)cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute(read_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
  }
  auto launch = [&]() -> cudaError_t {
    if (mode == 0) read_ldg_kernel<<<c->numSMs * 8, 256, 0, c->compute>>>((const uint4 *)src, n / 16, (unsigned *)(c->argmaxOut + 64));
    else read_bulk_kernel<<<c->numSMs, RP_THREADS, smem, c->compute>>>((const char *)src, n, slot, spw);
    return cudaGetLastError();
  };
  float ms = 0;
  const int r = hg_time_runs(c, iters, launch, &ms);
  if (r == 0) *bytesPerSecond = bytes * iters / (ms / 1e3);
  return r;
}

}  // extern "C"
