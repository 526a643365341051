/**
 * Shared test fixtures for model I/O: a seeded PRNG, synthetic llama2.c files, and a
 * straightforward (quadratic) llama2.c/SentencePiece BPE encoder used as the reference.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** Seeded PRNG (mulberry32, src/seeded-random.ts). */
export { seededRandom as rng } from "../src/index.js";

const made: string[] = [];

/** A fresh directory under the OS temp dir, removed by `removeTempDirs`. */
export function tempDir(prefix = "hg-core-"): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  made.push(d);
  return d;
}

export function removeTempDirs(): void {
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
}

export function randomF32(r: () => number, n: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = r() * 2 - 1;
  return a;
}

export function bytesOf(a: Float32Array | Uint16Array): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

const hexByte = (b: number) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`;

/** A vocabulary in HF form (▁ for space) with llama2.c scores; kind 0 ordinary, 1 special, 2 byte. */
export interface SyntheticVocab {
  pieces: string[];
  scores: number[];
  kind: number[];
}

/**
 * Llama-like vocab: <unk>,<s>,</s>, 256 byte pieces, single characters, pieces built by
 * concatenating random pairs (distinct scores), and whitespace runs sharing score -1e9 as in
 * Llama 2.
 */
export function syntheticVocab(r: () => number, merged = 150): SyntheticVocab {
  const pieces = ["<unk>", "<s>", "</s>"];
  const scores = [0, 0, 0];
  const kind = [1, 1, 1];
  for (let b = 0; b < 256; b++) {
    pieces.push(hexByte(b));
    scores.push(0);
    kind.push(2);
  }
  const singles = ["▁", "a", "b", "c", "d", "e", "é", "日"];
  const seen = new Set<string>();
  const add = (p: string, s: number) => {
    seen.add(p);
    pieces.push(p);
    scores.push(s);
    kind.push(0);
  };
  for (const c of singles) add(c, -1e9);
  const ordinary = () => pieces.filter((_, i) => kind[i] === 0);
  for (let tries = 0; seen.size < singles.length + merged && tries < 100_000; tries++) {
    const ord = ordinary();
    const p = ord[Math.floor(r() * ord.length)] + ord[Math.floor(r() * ord.length)];
    if (p.length > 7 || seen.has(p) || /^▁+$/.test(p)) continue;
    add(p, -(seen.size * 3 + Math.floor(r() * 3))); // distinct, roughly by creation order
  }
  for (let n = 2; n <= 6; n++) if (n !== 5) add("▁".repeat(n), -1e9);
  return { pieces, scores, kind };
}

/** Serialises a vocab as llama2.c's tokenizer.bin (spaces, "\n<s>\n", optional chr(b) bytes). */
export function tokenizerBin(v: SyntheticVocab, oldByteFormat: boolean): Uint8Array {
  const enc = new TextEncoder();
  const strs = v.pieces.map((p, i) => {
    if (i === 1) return "\n<s>\n";
    if (i === 2) return "\n</s>\n";
    if (v.kind[i] === 2 && oldByteFormat) return String.fromCharCode(i - 3);
    return p.replaceAll("▁", " ");
  });
  const encoded = strs.map((s) => enc.encode(s));
  const maxLen = Math.max(...encoded.map((e) => e.length));
  const total = 4 + encoded.reduce((a, e) => a + 8 + e.length, 0);
  const out = new Uint8Array(total);
  const dv = new DataView(out.buffer);
  dv.setInt32(0, maxLen, true);
  let o = 4;
  encoded.forEach((e, i) => {
    dv.setFloat32(o, v.scores[i], true);
    dv.setInt32(o + 4, e.length, true);
    out.set(e, o + 8);
    o += 8 + e.length;
  });
  return out;
}

/**
 * llama2.c's encode, restated: prefix "▁", spaces → "▁", one symbol per code point (or its
 * bytes as ids b + 3), then repeatedly merge the adjacent pair whose concatenation is an
 * ordinary piece with the highest score, leftmost on ties.
 */
export function referenceEncode(v: SyntheticVocab, text: string, bos = true): number[] {
  const ord = new Map<string, number>();
  v.pieces.forEach((p, i) => v.kind[i] === 0 && ord.set(p, i));
  const out = bos ? [1] : [];
  if (text.length === 0) return out;
  const s = `▁${text.replaceAll(" ", "▁")}`;
  const toks: number[] = [];
  for (const ch of s) {
    const id = ord.get(ch);
    if (id !== undefined) toks.push(id);
    else for (const b of new TextEncoder().encode(ch)) toks.push(b + 3);
  }
  const str = (id: number) => (v.kind[id] === 0 ? v.pieces[id] : `\u0000${id}\u0000`);
  for (;;) {
    let best = -Infinity;
    let at = -1;
    let merged = -1;
    for (let i = 0; i + 1 < toks.length; i++) {
      const id = ord.get(str(toks[i]) + str(toks[i + 1]));
      if (id !== undefined && v.scores[id] > best) {
        best = v.scores[id];
        at = i;
        merged = id;
      }
    }
    if (at < 0) break;
    toks.splice(at, 2, merged);
  }
  return out.concat(toks);
}

/** Random text over the vocab's characters, spaces (incl. runs), and characters needing byte fallback. */
export function randomText(r: () => number, v: SyntheticVocab, maxLen = 40): string {
  const atoms = ["a", "b", "c", "d", "e", "é", "日", " ", "  ", "    ", "z", "😀", "\n"];
  const ord = v.pieces.filter((_, i) => v.kind[i] === 0);
  let s = "";
  const n = 1 + Math.floor(r() * maxLen);
  for (let i = 0; i < n; i++) {
    s += r() < 0.5 ? atoms[Math.floor(r() * atoms.length)] : ord[Math.floor(r() * ord.length)].replaceAll("▁", " ");
  }
  return s;
}

/** A llama2.c model.bin with random weights, and its arrays by llama2.c name. */
export function llama2cModelBin(
  r: () => number,
  h: { dim: number; hidden: number; layers: number; heads: number; kvHeads: number; vocab: number; seqLen: number; shared: boolean },
): { bin: Uint8Array; arrays: Map<string, Float32Array> } {
  const headSize = h.dim / h.heads;
  const kvDim = headSize * h.kvHeads;
  const L = h.layers;
  const spec: [string, number][] = [
    ["token_embedding", h.vocab * h.dim],
    ["rms_att", L * h.dim],
    ["wq", L * h.dim * h.dim],
    ["wk", L * kvDim * h.dim],
    ["wv", L * kvDim * h.dim],
    ["wo", L * h.dim * h.dim],
    ["rms_ffn", L * h.dim],
    ["w1", L * h.hidden * h.dim],
    ["w2", L * h.dim * h.hidden],
    ["w3", L * h.hidden * h.dim],
    ["rms_final", h.dim],
    ["freq_cis_real", (h.seqLen * headSize) / 2],
    ["freq_cis_imag", (h.seqLen * headSize) / 2],
  ];
  if (!h.shared) spec.push(["wcls", h.vocab * h.dim]);
  const arrays = new Map<string, Float32Array>();
  const total = 28 + 4 * spec.reduce((a, [, n]) => a + n, 0);
  const bin = new Uint8Array(total);
  const dv = new DataView(bin.buffer);
  [h.dim, h.hidden, h.layers, h.heads, h.kvHeads, h.shared ? h.vocab : -h.vocab, h.seqLen].forEach((x, i) => dv.setInt32(i * 4, x, true));
  let o = 28;
  for (const [name, n] of spec) {
    const a = randomF32(r, n);
    arrays.set(name, a);
    bin.set(bytesOf(a), o);
    o += 4 * n;
  }
  return { bin, arrays };
}
