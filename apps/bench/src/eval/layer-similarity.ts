/**
 * Consecutive-layer input similarity on stories15M (the paper's Figure 11 for this model), and
 * how close the speculative query q̃ₗ = RoPE(W_q⁽ˡ⁾·norm⁽ˡ⁾(xₗ₋₁)) comes to the true qₗ.
 * Greedy decoding from a prompt; the residual stream entering every layer is read at every
 * decode step through the attention stage's layer hook. `bun run build` first.
 *   ./bun apps/bench/src/eval/layer-similarity.ts [--tokens 200]
 */
import { ensureStories15M, LlamaModel, openModelDir, type DecodeAttention, type Tensor } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";

const i = process.argv.indexOf("--tokens");
const TOKENS = i > 0 ? Number(process.argv[i + 1]) : 200;
const dir = await ensureStories15M({ onProgress: (m) => console.error(m) });
using files = openModelDir(dir);
using be = createCpuBackend({ threads: 2 });
using model = LlamaModel.load(files, be, { maxContext: 256 });
const s = files.shape, L = s.layers, qw = s.heads * s.headDim;

function cos(a: Float32Array, b: Float32Array): number {
  let ab = 0, aa = 0, bb = 0;
  for (let j = 0; j < a.length; j++) {
    ab += a[j] * b[j];
    aa += a[j] * a[j];
    bb += b[j] * b[j];
  }
  return ab / Math.sqrt(aa * bb);
}

const inputSim = new Float64Array(L - 1), querySim = new Float64Array(L);
let steps = 0, pos = 0;
const xs: Float32Array[] = [];
const specQ = be.alloc([1, qw]);
// Full attention, plus a look at every layer's input and query.
const probe: DecodeAttention = {
  newSequence() {},
  beginStep(p) {
    pos = p;
    xs.length = 0;
  },
  layerInput(layer: number, x: Tensor) {
    xs[layer] = be.read(x, 0, s.hiddenSize);
  },
  attend(layer: number, q: Tensor, out: Tensor) {
    // q̃ of this layer from the previous layer's input (layer 0: its own input).
    model.projectQuery(layer, xTensor(xs[layer === 0 ? 0 : layer - 1]), pos, specQ);
    querySim[layer] += cos(be.read(specQ, 0, qw), be.read(q, 0, qw));
    model.attention.attendFull(layer, q, 0, pos, out);
  },
  endStep() {
    for (let l = 0; l + 1 < L; l++) inputSim[l] += cos(xs[l], xs[l + 1]);
    steps++;
  },
};
const xT = be.alloc([1, s.hiddenSize]);
function xTensor(v: Float32Array): Tensor {
  be.write(xT, v);
  return xT;
}
model.attention.setDecodeAttention(probe);

const prompt = files.tokenizer.encode("Once upon a time, there was a little dog named Spot who loved the rain.");
model.step(Int32Array.from(prompt), 0);
for (let t = prompt.length; t < Math.min(256, prompt.length + TOKENS); t++) model.step(Int32Array.of(model.argmaxLogits()), t);
model.attention.setDecodeAttention(null);
be.free(specQ);
be.free(xT);

console.log(`stories15M, ${steps} greedy decode steps: mean cosine similarity`);
console.log("layer pair   inputs xᵢ·xᵢ₊₁   q̃ᵢ₊₁·qᵢ₊₁ (speculative vs true query)");
for (let l = 0; l + 1 < L; l++) {
  console.log(`${`${l} → ${l + 1}`.padEnd(10)}   ${(inputSim[l] / steps).toFixed(3).padStart(14)}   ${(querySim[l + 1] / steps).toFixed(3).padStart(10)}`);
}
