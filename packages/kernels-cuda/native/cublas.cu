// cuBLAS opened at run time (libcublas.so.13, then .so.12): no link-time dependency, so the
// library builds and loads where cuBLAS is absent and the backend falls back to its own GEMM.
#include "common.cuh"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

// The few cuBLAS entry points and constants used (values from cublas_api.h / library_types.h).
typedef int (*create_fn)(void **);
typedef int (*destroy_fn)(void *);
typedef int (*set_stream_fn)(void *, cudaStream_t);
typedef int (*set_workspace_fn)(void *, void *, size_t);
typedef int (*gemm_ex_fn)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int, const void *, void *, int, int, int, int);
enum { OP_N = 0, OP_T = 1, R_32F = 0, R_16F = 2, R_16BF = 14, COMPUTE_32F = 68, GEMM_DEFAULT = -1 };

struct Cublas {
  void *lib;
  void *handle;
  destroy_fn destroy;
  gemm_ex_fn gemmEx;
};

int hg_cublas_load(HgCtx *c, const char *path) {
  const char *names[] = {"libcublas.so.13", "libcublas.so.12"};
  void *lib = NULL;
  const char *used = NULL;
  if (path) { lib = dlopen(path, RTLD_NOW | RTLD_LOCAL); used = path; }
  else for (int i = 0; i < 2 && !lib; i++) { lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL); used = names[i]; }
  if (!lib) {
    const char *e = dlerror();
    snprintf(c->cublasInfo, sizeof c->cublasInfo, "not found (%s)", e ? e : "dlopen failed");
    return -1;
  }
  create_fn create = (create_fn)dlsym(lib, "cublasCreate_v2");
  set_stream_fn setStream = (set_stream_fn)dlsym(lib, "cublasSetStream_v2");
  set_workspace_fn setWs = (set_workspace_fn)dlsym(lib, "cublasSetWorkspace_v2");
  Cublas *b = (Cublas *)calloc(1, sizeof(Cublas));
  b->lib = lib;
  b->destroy = (destroy_fn)dlsym(lib, "cublasDestroy_v2");
  b->gemmEx = (gemm_ex_fn)dlsym(lib, "cublasGemmEx");
  int s = -1;
  if (!create || !setStream || !b->destroy || !b->gemmEx || (s = create(&b->handle)) != 0 || setStream(b->handle, c->compute) != 0) {
    snprintf(c->cublasInfo, sizeof c->cublasInfo, "%s unusable (%s)", used, s > 0 ? "cublasCreate failed" : "missing symbols");
    if (b->handle) b->destroy(b->handle);
    dlclose(lib);
    free(b);
    return -1;
  }
  // The workspace is a slice of the arena, so cuBLAS never calls cudaMalloc behind our accounting.
  if (setWs) setWs(b->handle, c->cublasWorkspace, c->cublasWorkspaceBytes);
  c->cublas = b;
  snprintf(c->cublasInfo, sizeof c->cublasInfo, "%s", used);
  return 0;
}

void hg_cublas_unload(HgCtx *c) {
  if (!c->cublas) return;
  c->cublas->destroy(c->cublas->handle);
  dlclose(c->cublas->lib);
  free(c->cublas);
  c->cublas = NULL;
}

// Row-major out[n,m] = x[n,k]·w[m,k]ᵀ is column-major outᵀ(m×n) = W(k×m)ᵀ · Xᵀ(k×n).
int hg_cublas_gemm(HgCtx *c, float *out, const void *x, const void *w, int dt, int n, int k, int m) {
  if (!c->cublas) return -1;
  const int type = dt == DT_F32 ? R_32F : dt == DT_F16 ? R_16F : R_16BF;
  const float one = 1.f, zero = 0.f;
  int s = c->cublas->gemmEx(c->cublas->handle, OP_T, OP_N, m, n, k, &one, w, type, k, x, type, k, &zero, out, R_32F, m, COMPUTE_32F, GEMM_DEFAULT);
  return s ? 10000 + s : 0;
}
