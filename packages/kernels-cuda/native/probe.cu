// CUDA availability probe: answers "is there a usable GPU, and which?" without creating a
// context (no cudaMalloc, no cudaSetDevice), so it is cheap and safe on machines with no
// driver. cudart is linked statically: the library loads even where libcudart is absent, and
// the absence of a driver surfaces as an error string instead of a failed dlopen.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#define HG_CUDA_ABI_VERSION 16
// Built with -fvisibility=hidden (keeps static cudart's symbols private); exports are marked.
#define HG_EXPORT __attribute__((visibility("default")))

// Writes `text` into buf (always NUL-terminated when len > 0; truncated to fit).
static void put(char *buf, int len, const char *text) {
  if (buf == NULL || len <= 0) return;
  snprintf(buf, (size_t)len, "%s", text);
}

static void put_error(char *buf, int len, cudaError_t err) {
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s: %s", cudaGetErrorName(err), cudaGetErrorString(err));
  put(buf, len, tmp);
}

// Tabs and newlines would break the tab-separated record the JS side parses.
static void sanitize(char *s) {
  for (; *s; s++)
    if (*s == '\t' || *s == '\n' || *s == '\r') *s = ' ';
}

extern "C" {

HG_EXPORT int hg_cuda_abi_version(void) { return HG_CUDA_ABI_VERSION; }

// CUDA runtime version this library was built with (e.g. 13000).
HG_EXPORT int hg_cuda_runtime_version(void) {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : -1;
}

// Latest CUDA version the installed driver supports, 0 when there is no driver.
HG_EXPORT int hg_cuda_driver_version(void) {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : -1;
}

// One device as "name\tmajor\tminor\ttotalGlobalMemBytes\tmultiprocessors\tpciBusId".
// Returns 0, or -(cudaError) with "errName: errString" in buf.
HG_EXPORT int hg_cuda_device_info(int device, char *buf, int len) {
  cudaDeviceProp p;
  cudaError_t err = cudaGetDeviceProperties(&p, device);
  if (err != cudaSuccess) {
    put_error(buf, len, err);
    return -(int)err;
  }
  char pci[64] = "";
  if (cudaDeviceGetPCIBusId(pci, (int)sizeof pci, device) != cudaSuccess) pci[0] = '\0';
  char name[sizeof p.name + 1];
  memcpy(name, p.name, sizeof p.name);
  name[sizeof p.name] = '\0';
  sanitize(name);
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%s\t%d\t%d\t%llu\t%d\t%s", name, p.major, p.minor,
           (unsigned long long)p.totalGlobalMem, p.multiProcessorCount, pci);
  put(buf, len, tmp);
  return 0;
}

// Device count (≥ 0), with device 0's record (as hg_cuda_device_info) in buf when there is
// one; or -(cudaError) with "errName: errString" in buf (e.g. no driver, no device).
HG_EXPORT int hg_cuda_probe(char *buf, int len) {
  put(buf, len, "");
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    put_error(buf, len, err);
    return -(int)err;
  }
  if (count > 0) {
    int rc = hg_cuda_device_info(0, buf, len);
    if (rc < 0) return rc;
  }
  return count;
}

}  // extern "C"
