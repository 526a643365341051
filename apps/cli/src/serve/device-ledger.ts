/**
 * Device-memory admission for `hybridgen serve`: every request's sequence is made at its own
 * context (prompt + max_tokens), so it takes that context's device bytes — its KV window (the
 * whole context under full attention), its score rows and, for hybrid attention on a device,
 * the prefill's scratch — as core's sequenceBytes predicts them. A request is admitted when the
 * bytes it adds over an idle slot fit what the backend had free once the model and its idle
 * slots were loaded, less what the running requests reserved; it reserves the larger of the
 * prediction and what its sequence took when made, until it leaves.
 */
import type { Backend } from "@hybridgen/core";

export interface DeviceMemory {
  /** Bytes the backend can still allocate. */
  free(): number;
}

/** The backend's free device memory: the CUDA arena's, or the CPU backend's cap less its use (null: no cap, nothing to admit by). */
export function deviceMemory(backend: Backend): DeviceMemory | null {
  const b = backend as Partial<{ memory(): { freeBytes: number }; memoryCapBytes: number | null; memoryInUseBytes: number }>;
  if (typeof b.memory === "function") return { free: () => b.memory!().freeBytes };
  if (typeof b.memoryCapBytes === "number") return { free: () => b.memoryCapBytes! - b.memoryInUseBytes! };
  return null;
}

export class DeviceLedger {
  private held = 0;

  /**
   * `budgetBytes`: free device memory with the model and the idle slots loaded; `bytes(context)`:
   * device bytes a sequence of `context` positions takes; `idleContext`: an idle slot's.
   */
  constructor(
    readonly memory: DeviceMemory,
    readonly budgetBytes: number,
    private readonly bytes: (context: number) => number,
    private readonly idleContext: number,
  ) {}

  /** Bytes a request's sequence of `context` positions adds over the idle one it replaces. */
  need(context: number): number {
    return Math.max(0, this.bytes(context) - this.bytes(this.idleContext));
  }

  /** Whether `bytes` more fit beside what the running requests hold. */
  fits(bytes: number): boolean {
    return this.held + bytes <= this.budgetBytes;
  }

  /** Why `context` positions can never fit, even with nothing running (one line), or null. */
  refusal(context: number): string | null {
    const need = this.need(context);
    if (need <= this.budgetBytes) return null;
    return `its sequence needs ${mib(need)} of device memory, and ${mib(this.budgetBytes)} is left for requests beside the model`;
  }

  hold(bytes: number): void {
    this.held += bytes;
  }

  release(bytes: number): void {
    this.held = Math.max(0, this.held - bytes);
  }

  /** Bytes the running requests hold. */
  get reserved(): number {
    return this.held;
  }
}

const mib = (b: number): string => `${(b / 2 ** 20).toFixed(1)} MiB`;
