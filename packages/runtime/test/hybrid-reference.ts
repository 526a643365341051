/**
 * Plain TypeScript (f64) reference of hybrid attention on the tiny Llama of engine-helpers:
 * token by token, each decode step's attention restricted to window ∪ selected offloaded
 * tokens, the offloaded logits taken with the true query (exact) or with the speculative
 * query q̃ₗ = RoPE(W_q⁽ˡ⁾·norm⁽ˡ⁾(xₗ₋₁)) (layer 0: the true query).
 */
import type { ModelFiles } from "@hybridgen/core";
import type { TinyWeights } from "@hybridgen/core/testing";

export type RefSelect =
  | { kind: "all" }
  /** exact top-K per KV head of max-over-group logits (ties to the lower slot). */
  | { kind: "topk"; k: number }
  /** StreamingLLM positional: `sinks` oldest + newest offloaded, k in all. */
  | { kind: "streaming"; k: number; sinks: number };

export interface RefStep {
  /** Offloaded positions [sinks, sinks + storeCount) at this step; 0 = full attention. */
  storeCount: number;
  sinks: number;
  select: RefSelect;
  speculative: boolean;
  /** q̃ chooses `candidates`·K tokens, the true query scores them (needs speculative). */
  verified?: boolean;
  candidates?: number;
  /** Layers that select with the true query even when speculative. */
  exactLayers?: number[];
}

/** Indices of the k largest of vals, ascending, ties to the lower index. */
export function refTopK(vals: number[], k: number): number[] {
  const order = vals.map((v, i) => i).sort((a, b) => vals[b] - vals[a] || a - b);
  return order.slice(0, Math.min(k, vals.length)).sort((a, b) => a - b);
}

export class HybridReference {
  private readonly ks: number[][][] = []; // [layer][pos] kvHeads·hd
  private readonly vs: number[][][] = [];
  private readonly s;
  /** The q̃ of every layer at the last step (for the definition test). */
  lastSpecQ: number[][] = [];

  constructor(private readonly files: ModelFiles, private readonly weights: TinyWeights) {
    this.s = files.shape;
    for (let l = 0; l < this.s.layers; l++) {
      this.ks.push([]);
      this.vs.push([]);
    }
  }

  private get(name: string): Float32Array {
    return this.weights.get(name)!.values;
  }

  linear(x: number[], name: string, out: number, inn: number, biasName?: string): number[] {
    const w = this.get(name), b = biasName ? this.weights.get(biasName)?.values : undefined;
    return Array.from({ length: out }, (_, j) => {
      let acc = b ? b[j] : 0;
      for (let c = 0; c < inn; c++) acc += x[c] * w[j * inn + c];
      return acc;
    });
  }

  rms(x: number[], name: string): number[] {
    const w = this.get(name);
    const r = 1 / Math.sqrt(x.reduce((a, v) => a + v * v, 0) / x.length + this.s.normEps);
    return x.map((v, i) => v * r * w[i]);
  }

  rope(v: number[], heads: number, pos: number): number[] {
    const hd = this.s.headDim, out = v.slice();
    for (let h = 0; h < heads; h++)
      for (let j = 0; j < hd / 2; j++) {
        const ang = pos / this.s.ropeTheta ** ((2 * j) / hd);
        const a = v[h * hd + j], b = v[h * hd + j + hd / 2];
        out[h * hd + j] = a * Math.cos(ang) - b * Math.sin(ang);
        out[h * hd + j + hd / 2] = b * Math.cos(ang) + a * Math.sin(ang);
      }
    return out;
  }

  /** The query of `layer` from residual row x at `pos` (the speculative query's definition). */
  query(layer: number, x: number[], pos: number): number[] {
    const s = this.s, p = `model.layers.${layer}.`;
    const h = this.rms(x, `${p}input_layernorm.weight`);
    return this.rope(this.linear(h, `${p}self_attn.q_proj.weight`, s.heads * s.headDim, s.hiddenSize, `${p}self_attn.q_proj.bias`), s.heads, pos);
  }

  /** Runs token `id` at the next position; returns its logits. */
  step(id: number, st: RefStep): number[] {
    const s = this.s, dim = s.hiddenSize, H = s.heads, KV = s.kvHeads, hd = s.headDim, group = H / KV;
    const pos = this.ks[0].length;
    let x = Array.from(this.get("model.embed_tokens.weight").subarray(id * dim, (id + 1) * dim));
    let prevX = x;
    this.lastSpecQ = [];
    for (let l = 0; l < s.layers; l++) {
      const p = `model.layers.${l}.`;
      const h = this.rms(x, `${p}input_layernorm.weight`);
      const q = this.rope(this.linear(h, `${p}self_attn.q_proj.weight`, H * hd, dim, `${p}self_attn.q_proj.bias`), H, pos);
      this.ks[l].push(this.rope(this.linear(h, `${p}self_attn.k_proj.weight`, KV * hd, dim, `${p}self_attn.k_proj.bias`), KV, pos));
      this.vs[l].push(this.linear(h, `${p}self_attn.v_proj.weight`, KV * hd, dim, `${p}self_attn.v_proj.bias`));
      const specQ = l === 0 ? q : this.query(l, prevX, pos);
      this.lastSpecQ.push(specQ);
      const ahead = st.speculative && !(st.exactLayers ?? []).includes(l);
      const widen = ahead && st.verified && l > 0 ? (st.candidates ?? 1) : 1;
      const qSel = ahead ? specQ : q, qOff = ahead && !st.verified ? specQ : q;
      const dot = (qq: number[], hh: number, u: number) => {
        const g = Math.floor(hh / group);
        let d = 0;
        for (let c = 0; c < hd; c++) d += qq[hh * hd + c] * this.ks[l][u][g * hd + c];
        return d / Math.sqrt(hd);
      };
      const off0 = st.sinks, n = st.storeCount;
      // Selected offloaded slots per KV head.
      const chosen: number[][] = [];
      for (let g = 0; g < KV; g++) {
        if (n === 0) chosen.push([]);
        else if (st.select.kind === "all") chosen.push(Array.from({ length: n }, (_, j) => j));
        else if (st.select.kind === "streaming") {
          const k = Math.min(st.select.k * widen, n), sk = Math.min(st.select.sinks, k);
          const ids = Array.from({ length: sk }, (_, j) => j);
          for (let j = n - (k - sk); j < n; j++) ids.push(j);
          chosen.push(ids);
        } else {
          const best = Array.from({ length: n }, (_, j) => {
            let m = -Infinity;
            for (let hh = g * group; hh < (g + 1) * group; hh++) m = Math.max(m, dot(qSel, hh, off0 + j));
            return m;
          });
          chosen.push(refTopK(best, st.select.k * widen));
        }
      }
      const att = new Array(H * hd).fill(0);
      for (let hh = 0; hh < H; hh++) {
        const g = Math.floor(hh / group);
        const us: number[] = [], sc: number[] = [];
        for (let u = 0; u <= pos; u++) {
          const offloaded = u >= off0 && u < off0 + n;
          if (!offloaded) { us.push(u); sc.push(dot(q, hh, u)); }
        }
        for (const j of chosen[g]) { us.push(off0 + j); sc.push(dot(qOff, hh, off0 + j)); }
        const m = Math.max(...sc), e = sc.map((v) => Math.exp(v - m)), z = e.reduce((a, v) => a + v, 0);
        us.forEach((u, i) => {
          for (let c = 0; c < hd; c++) att[hh * hd + c] += (e[i] / z) * this.vs[l][u][g * hd + c];
        });
      }
      const o = this.linear(att, `${p}self_attn.o_proj.weight`, dim, H * hd, `${p}self_attn.o_proj.bias`);
      prevX = x;
      x = x.map((v, i) => v + o[i]);
      const h2 = this.rms(x, `${p}post_attention_layernorm.weight`);
      const gg = this.linear(h2, `${p}mlp.gate_proj.weight`, s.intermediateSize, dim);
      const uu = this.linear(h2, `${p}mlp.up_proj.weight`, s.intermediateSize, dim);
      const a = gg.map((v, i) => (v / (1 + Math.exp(-v))) * uu[i]);
      const d = this.linear(a, `${p}mlp.down_proj.weight`, dim, s.intermediateSize);
      x = x.map((v, i) => v + d[i]);
    }
    const hn = this.rms(x, "model.norm.weight");
    const head = this.weights.has("lm_head.weight") ? "lm_head.weight" : "model.embed_tokens.weight";
    return this.linear(hn, head, s.vocabSize, dim);
  }
}
