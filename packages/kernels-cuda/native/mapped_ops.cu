// The CPU stage's output read by the device where it lies, in mapped pinned host memory, when
// the op runs (after hg_link_await_signal, so the stage may write it after the step was queued):
// 2-D copies into device tensors (the stage's logits), and −∞ padding of score columns past each
// group's count in the stage's [counts | ids] table. Both record into a decode step; src and
// table are device addresses of mapped host memory that TypeScript (src/host-link.ts) checked.
#include "common.cuh"
#include <math.h>

// rows × pieces elements of T (16 or 4 bytes) from src rows (srcPitch bytes apart) to dst rows.
template <typename T>
__global__ void read_mapped_kernel(char *__restrict__ dst, const char *__restrict__ src, int pieces, long long rows, long long dstPitch, long long srcPitch) {
  const long long total = rows * pieces;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / pieces;
    const int p = (int)(i - r * pieces);
    ((T *)(dst + r * dstPitch))[p] = ((const T *)(src + r * srcPitch))[p];
  }
}

// One block a head: columns [col + n, col + kmax) of row h become −∞, n = table[h / group]
// clamped to [0, kmax] (one host-memory read a warp: every lane loads the same word).
__global__ void pad_columns_kernel(float *__restrict__ scores, const int *__restrict__ table, int width, int col, int kmax, int group) {
  const int h = blockIdx.x;
  const int n = min(max(table[h / group], 0), kmax);
  float *row = scores + (long long)h * width + col;
  for (int j = n + threadIdx.x; j < kmax; j += blockDim.x) row[j] = -INFINITY;
}

Cmd hg_new_cmd(int kind);

// CMD_READ_MAPPED: p[0] dst, p[1] src (device address of mapped host memory); s[0] pieces a row,
// s[1] rows, s[2] dst pitch, s[3] src pitch (bytes), s[4] piece bytes (16 or 4).
int hg_launch_read_mapped(HgCtx *c, const Cmd &m) {
  const long long total = (long long)m.s[0] * m.s[1];
  const unsigned blocks = hg_blocks((size_t)total, 256, (unsigned)c->numSMs * 8);
  if (m.s[4] == 16)
    read_mapped_kernel<uint4><<<blocks, 256, 0, c->compute>>>((char *)m.p[0], (const char *)m.p[1], m.s[0], m.s[1], m.s[2], m.s[3]);
  else
    read_mapped_kernel<unsigned><<<blocks, 256, 0, c->compute>>>((char *)m.p[0], (const char *)m.p[1], m.s[0], m.s[1], m.s[2], m.s[3]);
  return hg_launched();
}

// CMD_PAD_COLUMNS: p[0] scores, p[1] table (device address of mapped host memory); s[0] heads,
// s[1] width, s[2] col, s[3] kmax, s[4] group.
int hg_launch_pad_columns(HgCtx *c, const Cmd &m) {
  const int kmax = m.s[3];
  const int threads = kmax >= 256 ? 256 : (kmax + 31) / 32 * 32;
  pad_columns_kernel<<<m.s[0], threads, 0, c->compute>>>((float *)m.p[0], (const int *)m.p[1], m.s[1], m.s[2], kmax, m.s[4]);
  return hg_launched();
}

extern "C" {

// rows rows of width bytes (a multiple of 4) from src (mapped host memory, srcPitch bytes
// apart) into dst (dstPitch apart), read by a kernel on the compute stream, or recorded.
HG_EXPORT int hg_cu_read_mapped(HgCtx *c, void *dst, const void *src, int width, int rows, int dstPitch, int srcPitch) {
  if (width <= 0 || rows <= 0 || width % 4 || !dst || !src) return (int)cudaErrorInvalidValue;
  if (rows == 1) dstPitch = srcPitch = width;  // unused: the alignment below ignores them
  if (dstPitch < width || srcPitch < width || ((uintptr_t)dst | (uintptr_t)src | (unsigned)dstPitch | (unsigned)srcPitch) % 4) return (int)cudaErrorInvalidValue;
  const int piece = ((uintptr_t)dst | (uintptr_t)src | (unsigned)width | (unsigned)dstPitch | (unsigned)srcPitch) % 16 ? 4 : 16;
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_READ_MAPPED);
  m.p[0] = dst; m.p[1] = src;
  m.s[0] = width / piece; m.s[1] = rows; m.s[2] = dstPitch; m.s[3] = srcPitch; m.s[4] = piece;
  return hg_submit(c, m);
}

// f32 scores [heads, width]: columns [col + counts[h / group], col + kmax) of row h become −∞,
// counts = the first heads / group ints at table (mapped host memory), read when it runs.
HG_EXPORT int hg_cu_pad_columns(HgCtx *c, float *scores, const int *table, int heads, int width, int col, int kmax, int group) {
  if (heads <= 0 || kmax <= 0 || group <= 0 || heads % group || col < 0 || (long long)col + kmax > width || !scores || !table || (uintptr_t)table % 4)
    return (int)cudaErrorInvalidValue;
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_PAD_COLUMNS);
  m.p[0] = scores; m.p[1] = table;
  m.s[0] = heads; m.s[1] = width; m.s[2] = col; m.s[3] = kmax; m.s[4] = group;
  return hg_submit(c, m);
}

}  // extern "C"
