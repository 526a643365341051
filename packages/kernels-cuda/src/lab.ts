/**
 * @hybridgen/kernels-cuda/lab: what only the lab reaches for — the benches' and device checks'
 * switches and probes of a CudaBackend (cudaLab(backend)), kept out of the Backend a program uses.
 * Not part of the package's API; it may change in any release.
 */
import { DEFAULT_MATVEC_FUSION, type CudaBackend } from "./cuda-backend.js";
import { LAB, type CudaLab } from "./lab-key.js";

export { DEFAULT_MATVEC_FUSION, type CudaLab };

/** The bench-only switches and probes of `backend`. */
export function cudaLab(backend: CudaBackend): CudaLab {
  return backend[LAB]();
}
