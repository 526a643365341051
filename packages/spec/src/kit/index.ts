/**
 * @hybridgen/spec/kit: what a backend author reuses — the reference backend (the oracle every
 * backend is checked against), the argument checks of backend ops, the CPU stage built from
 * Backend ops, native-library loading and the deterministic random fill.
 */
export * from "./backend-checks.js";
export * from "./reference-backend.js";
export * from "./backend-cpu-stage.js";
export * from "./gathered-values.js";
export * from "./native-library.js";
export * from "./random-fill.js";
export * from "./rel-l2-error.js";
