/** The text report of `hybridgen profile-kmin`: agreement per selector × K, K_min, recall per layer. */
import type { HybridProfile } from "@hybridgen/runtime";
import { pct, type ProfileMeasurements } from "./profile-kmin-measure.js";

function table(head: string[], rows: string[][]): string {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (r: string[]) => r.map((c, i) => (i === 0 ? c.padEnd(w[i]!) : c.padStart(w[i]!))).join("  ").trimEnd();
  return [line(head), ...rows.map(line)].join("\n") + "\n";
}

export function formatProfileReport(p: HybridProfile, m: ProfileMeasurements, o: { texts: string[] }): string {
  let out = `model: ${p.model}\n`;
  out += `text: ${o.texts.join(", ")}\n`;
  out += `window ${p.gpuKvBudget} tokens (${p.sinkTokens} sinks), ${p.steps} decode steps with offloaded tokens compared with full attention (exact logits)\n\n`;

  const ks = p.perSelector[p.selector]!.agreement.map(([k]) => k);
  out += "top-1 agreement / mean KL(full ‖ hybrid):\n";
  out += table(
    ["selector", "timing", ...ks.map((k) => `K=${k}`), "K_min"],
    Object.entries(p.perSelector).map(([name, s]) => [
      name, m.perSelector[name]!.timing, ...s.agreement.map(([, top1, kl]) => `${pct(top1)} ${kl.toExponential(1)}`), s.kMin === null ? "none" : String(s.kMin),
    ]),
  );
  out += `K_min: smallest K with top-1 ≥ ${pct(p.tolerance)}; the profile's kMin is ${p.selector}'s: ${p.kMin}\n\n`;

  const choice = p.candidates === 1 ? "top-K" : `top ${p.candidates}·K`;
  out += `speculation: recall of the true query's top-K by q̃'s ${choice} (q̃ from the previous layer's input), per layer, tokens / attention mass:\n`;
  out += table(
    ["layer", ...m.recallKs.map((k) => (k === p.recallK ? `K=${k}*` : `K=${k}`)), "selection"],
    p.layerRecall.map((_, l) => [
      String(l),
      ...m.recall[l]!.map((r, i) => `${r.toFixed(3)} / ${m.massRecall[l]![i]!.toFixed(3)}`),
      l === 0 ? "speculative (q̃₀ is q₀)" : p.exactLayers.includes(l) ? "exact" : "speculative",
    ]),
  );
  out += `exactLayers (${p.recallMetric} recall at K=${p.recallK} below ${p.recallThreshold}): ${p.exactLayers.length === 0 ? "none" : p.exactLayers.join(", ")}\n`;
  return out;
}
