/** Helpers shared by the runtime's batch and disk-tier tests. */
import { readdirSync, readlinkSync } from "node:fs";
import type { BatchDecoder } from "@hybridgen/core";

const argmax = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b]! ? i : b), 0);

/**
 * Prompts 0–2 in slots 0–2, then batched greedy steps until prompt i has `steps[i]` logits; when
 * prompt 0 is done, prompt 3 is prefilled into its slot and joins the batch (`joined` runs then).
 * The logits before each token.
 */
export function decodeBatched(dec: BatchDecoder, prompts: readonly Int32Array[], steps: readonly number[], joined: () => void = () => {}): Float32Array[][] {
  const out: Float32Array[][] = prompts.map(() => []);
  const slotOf = [0, 1, 2, 0];
  const live: number[] = [];
  const join = (i: number) => {
    dec.prefill(slotOf[i]!, prompts[i]!, 0);
    out[i]!.push(dec.logits(slotOf[i]!));
    live.push(i);
  };
  [0, 1, 2].forEach(join);
  while (live.length > 0) {
    dec.step(live.map((i) => slotOf[i]!), Int32Array.from(live, (i) => argmax(out[i]!.at(-1)!)));
    for (const i of live) out[i]!.push(dec.logits(slotOf[i]!));
    for (const i of [...live]) {
      if (out[i]!.length < steps[i]!) continue;
      live.splice(live.indexOf(i), 1);
      if (i === 0) {
        join(3);
        joined();
      }
    }
  }
  return out;
}

/** Descriptors of this process open on a file in `dir` (spill files are unlinked while open). */
export const openIn = (dir: string) =>
  readdirSync("/proc/self/fd").map((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      return "";
    }
  }).filter((l) => l.startsWith(`${dir}/`));
