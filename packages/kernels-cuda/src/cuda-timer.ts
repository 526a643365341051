/** CUDA events on a backend's compute stream: T_gpu for the scheduler, and the benchmarks' clock. */
import type { Pointer } from "bun:ffi";
import { HybridgenError } from "@hybridgen/spec";
import type { CudaNative } from "./native-backend.js";

/** Two CUDA events on the backend's compute stream (T_gpu for the scheduler; benchmarks). */
export class CudaTimer implements Disposable {
  private readonly a: Pointer;
  private readonly b: Pointer;
  private marks = 0;

  constructor(private readonly lib: CudaNative, private readonly ctx: Pointer, private readonly ok: (op: string, rc: number) => void) {
    const a = lib.hg_cu_event_new(), b = lib.hg_cu_event_new();
    if (!a || !b) {
      if (a) lib.hg_cu_event_free(a);
      if (b) lib.hg_cu_event_free(b);
      throw new HybridgenError("CUDA timer: could not create events", "ECUDA");
    }
    this.a = a as Pointer;
    this.b = b as Pointer;
  }

  /** First call: start; second: stop. */
  mark(): void {
    this.ok("timer.mark", this.lib.hg_cu_event_record(this.ctx, this.marks === 0 ? this.a : this.b, 0));
    this.marks = this.marks === 0 ? 1 : 2;
  }

  /** Milliseconds between the two marks (waits for the second). */
  ms(): number {
    if (this.marks !== 2) throw new HybridgenError("CUDA timer: ms() needs two mark() calls", "EBADARG");
    const out = new Float32Array(1);
    this.ok("timer.ms", this.lib.hg_cu_event_elapsed(this.a, this.b, out));
    this.marks = 0;
    return out[0];
  }

  close(): void {
    this.lib.hg_cu_event_free(this.a);
    this.lib.hg_cu_event_free(this.b);
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

