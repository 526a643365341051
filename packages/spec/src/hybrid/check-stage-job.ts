/** Boundary checks every CpuStage runs on a job before touching memory. */
import type { Tensor } from "../backend.js";
import { fail } from "../errors.js";
import { pageIndexForm } from "../contracts/page-index.js";
import type { CpuStageJob, CpuStageShape } from "./cpu-stage.js";

function checkStore(t: Tensor, what: string, shape: CpuStageShape): void {
  const s = t.shape;
  if (s.length !== 3 || s[0] !== shape.kvHeads || s[1] !== shape.storeCapacity || s[2] !== shape.headDim) {
    fail(`cpu stage: ${what} has shape [${s.join(", ")}], expected [${shape.kvHeads}, ${shape.storeCapacity}, ${shape.headDim}] (mismatched head layout)`);
  }
}

export function checkStageJob(job: CpuStageJob, shape: CpuStageShape): void {
  if (job.slot !== 0 && job.slot !== 1) fail(`cpu stage: slot must be 0 or 1, got ${job.slot}`);
  checkStore(job.k, "store K", shape);
  checkStore(job.v, "store V", shape);
  if (!(Number.isInteger(job.offloaded) && job.offloaded >= 1 && job.offloaded <= shape.storeCapacity)) {
    fail(`cpu stage: offloaded count ${job.offloaded} out of range [1, ${shape.storeCapacity}]`);
  }
  if (!(Number.isInteger(job.kmax) && job.kmax >= 0 && job.kmax <= job.offloaded)) {
    fail(`cpu stage: width ${job.kmax} out of range [0, ${job.offloaded}]`);
  }
  if (!(Number.isFinite(job.scale) && job.scale > 0)) fail(`cpu stage: scale must be a positive number, got ${job.scale}`);
  const r = job.ready;
  if (r !== undefined && !(Number.isSafeInteger(r.address) && r.address > 0 && r.address % 4 === 0 && Number.isInteger(r.value) && r.value >= 0 && r.value <= 0xffffffff)) {
    fail("cpu stage: ready must be a 4-byte-aligned host address and a 32-bit value");
  }
  if (job.keys && !shape.stageKeys) fail("cpu stage: a job asks for K rows but the stage was prepared without stageKeys");
  const w = job.work;
  if ((w.kind === "topk" || w.kind === "quest" || w.kind === "streaming" || w.kind === "index") && !(Number.isInteger(w.budget) && w.budget >= 0 && w.budget <= job.kmax)) {
    fail(`cpu stage: ${w.kind === "topk" ? "top-K" : w.kind} budget ${w.budget} out of range [0, ${job.kmax}]`);
  }
  if (w.kind === "streaming" && !(Number.isInteger(w.sinks) && w.sinks >= 0 && w.sinks <= 0x7fffffff)) {
    fail(`cpu stage: streaming sinks must be a non-negative 32-bit integer, got ${w.sinks}`);
  }
  if (w.kind === "quest" && !(Number.isInteger(w.pageSize) && w.pageSize >= 1 && w.pageSize <= 4096)) {
    fail(`cpu stage: quest page size must be an integer in [1, 4096], got ${w.pageSize}`);
  }
  if (w.kind === "index") {
    pageIndexForm(w.form);
    if (!(Number.isInteger(w.pageSize) && w.pageSize >= 1 && w.pageSize <= 4096)) fail(`cpu stage: index page size must be an integer in [1, 4096], got ${w.pageSize}`);
    if (!(Number.isInteger(w.superPages) && w.superPages >= 1 && w.superPages <= 4096)) fail(`cpu stage: index pages per super-page must be an integer in [1, 4096], got ${w.superPages}`);
  }
}
