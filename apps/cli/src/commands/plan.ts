/**
 * `hybridgen plan --model DIR|preset:X --context N [--batch B]`: where every byte of a hybrid
 * run would go — weights, the GPU window, K and V on each host tier, the disk — from the GPU's
 * free memory and each tier's measured read bandwidth, and the ms/token those bandwidths
 * predict (@hybridgen/memtier's planRun). A run that fits nowhere prints the plan and the
 * reason, and exits non-zero. No weights are loaded.
 */
import { parseArgs } from "node:util";
import { HybridgenError, type DType, type MemoryTier, indexWant, isFileTier, tierKind } from "@hybridgen/core";
import type { RunPlan } from "@hybridgen/memtier";
import { backendChoices, BackendChoiceSchema, defaultStageThreads, deviceIndexShape, HYBRID_DEFAULTS, keepProblem, parseHybridFlag, planSelection, probeBackendChoice, type DeviceProbe, type HybridRuntimeOptions, type LogitsMode, type ProbeOptions } from "@hybridgen/runtime";
import type { CliIo } from "../io.js";
import { checkDiskDir, KV_TIER_HELP, parseSize, placementNote, readDepthValue, storeTiers, KvTierCliOptionsSchema } from "../kv-tier-options.js";
import { parseArgsError } from "../parse-args-error.js";
import { inspectModel } from "./inspect.js";
import { probeTiers } from "./plan-probe.js";

export const PLAN_HELP = `Usage: hybridgen plan --model DIR|preset:NAME --context N [options]

Where every byte of a hybrid-attention run would go (weights, the GPU window, K and V on each
host memory tier, the disk) and the ms/token predicted from the tiers' measured bandwidths.
A context that fits nowhere is refused with the numbers (exit 2).

      --model M                a model directory or preset:NAME (only its config is read)
      --context N              positions per sequence
      --batch B                sequences (default 1)
      --gpu-kv-budget N|auto|least
                               window tokens per sequence on the GPU (default auto: what its memory holds; least: the
                               smallest the host tiers leave — with the page index on the device an offloaded token
                               costs the device its index bytes, a window token its K and V: the scale runs' window)
      --k K                    offloaded tokens selected per KV head and layer (default 64)
      --selector NAME          the selector whose bytes the step reads (default: the engine's pair, a top-K scan of every
                               offloaded K; quest: two K rows a page; streaming: none; index: the page index's own bytes)
      --logits MODE            exact, speculative or verified (default; candidates·K rows and their K go up)
      --candidates N           verified logits' candidates per selected token (default 4)
      --keep N                 verified: keep N·K of the scored candidates, only their V rows go up (default: all)
      --index JSON             the page index chooses the rows: its options, e.g. '{"form":"int4","placement":"device"}'
                               (the index selector's: form, pageSize, superPages, placement auto|host|device); a probed GPU
                               times its ranking at the context's pages, which the GPU stage then charges a layer
      --kv-dtype D             f32, f16 or bf16 (default bf16)
      --device D               auto, cpu, cuda or a backend module: the backend whose device is probed (cpu: the
                               CPU alone; auto: the highest-ranked usable one, the GPU where CUDA is usable)
      --gpu-free SIZE          plan for a GPU with this much free memory instead of probing one
      --gpu-bandwidth GB/s     its read bandwidth (default: measured when a GPU is present)
      --link-bandwidth GB/s    host→device copy bandwidth (default: measured when a GPU is present)
      --no-probe               skip the bandwidth probes (ms/token is then not predicted)
      --json                   the plan as one JSON object
${KV_TIER_HELP}`;

const num = (flag: string, raw: string | undefined): number | undefined => {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!/^\d+(\.\d+)?$/.test(raw.trim()) || !(n > 0)) throw new HybridgenError(`invalid value for ${flag}: ${JSON.stringify(raw)} is not a positive number`, "EUSAGE");
  return n;
};
const int = (flag: string, raw: string | undefined): number | undefined => {
  const n = num(flag, raw);
  if (n !== undefined && !Number.isInteger(n)) throw new HybridgenError(`invalid value for ${flag}: ${JSON.stringify(raw)} is not a positive integer`, "EUSAGE");
  return n;
};

export async function runPlan(argv: readonly string[], io: CliIo): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...argv],
      strict: true,
      allowPositionals: false,
      options: {
        model: { type: "string" }, context: { type: "string" }, batch: { type: "string" }, "gpu-kv-budget": { type: "string" }, k: { type: "string" },
        "kv-dtype": { type: "string" }, device: { type: "string" }, "gpu-free": { type: "string" }, "gpu-bandwidth": { type: "string" },
        "link-bandwidth": { type: "string" }, "no-probe": { type: "boolean" }, json: { type: "boolean" }, index: { type: "string" },
        selector: { type: "string" }, logits: { type: "string" }, candidates: { type: "string" }, keep: { type: "string" },
        "kv-placement": { type: "string" }, "kv-disk": { type: "string" }, "host-kv-budget": { type: "string" }, "kv-disk-read-depth": { type: "string" }, help: { type: "boolean", short: "h" },
      },
    });
  } catch (e) {
    throw parseArgsError(e, "hybridgen plan");
  }
  const v = parsed.values;
  if (v.help) {
    io.stdout(PLAN_HELP);
    return 0;
  }
  if (v.model === undefined) throw new HybridgenError("hybridgen plan needs --model DIR|preset:NAME", "EUSAGE");
  const context = int("--context", v.context);
  if (context === undefined) throw new HybridgenError("hybridgen plan needs --context N", "EUSAGE");
  const batch = int("--batch", v.batch) ?? 1;
  const kvDtype = (v["kv-dtype"] ?? "bf16") as DType;
  if (!["f32", "f16", "bf16"].includes(kvDtype)) throw new HybridgenError(`invalid value for --kv-dtype: must be one of f32, f16, bf16 (got ${JSON.stringify(kvDtype)})`, "EUSAGE");
  const device = v.device ?? "auto";
  if (!BackendChoiceSchema.safeParse(device).success) throw new HybridgenError(`invalid value for --device: must be ${backendChoices()} (got ${JSON.stringify(device)})`, "EUSAGE");
  const budgetRaw = (v["gpu-kv-budget"] ?? "auto").trim();
  if (!["auto", "least"].includes(budgetRaw) && !/^\d+$/.test(budgetRaw)) throw new HybridgenError(`invalid value for --gpu-kv-budget: must be auto, least or a positive token count (got ${JSON.stringify(budgetRaw)})`, "EUSAGE");
  const leastWindow = budgetRaw === "least";
  const gpuKvBudget = budgetRaw === "auto" || leastWindow ? ("auto" as const) : int("--gpu-kv-budget", budgetRaw)!;
  const tierRaw = KvTierCliOptionsSchema.safeParse({
    kvPlacement: v["kv-placement"], kvDisk: v["kv-disk"], hostKvBudget: v["host-kv-budget"] === undefined ? undefined : parseSize(v["host-kv-budget"], "--host-kv-budget"),
    readDepth: v["kv-disk-read-depth"] === undefined ? undefined : readDepthValue(v["kv-disk-read-depth"]),
  });
  if (!tierRaw.success) {
    const issue = tierRaw.error.issues[0]!; // a refine names its flags; a range names the flag
    throw new HybridgenError(issue.code === "custom" ? issue.message : `invalid value for --${issue.path[0] === "readDepth" ? "kv-disk-read-depth" : "kv-placement"}: ${issue.message}`, "EUSAGE");
  }
  const tierOpts = tierRaw.data;
  if (tierOpts.kvDisk !== undefined) checkDiskDir(tierOpts.kvDisk);

  const index = v.index === undefined ? undefined : await indexOptions(v.index);
  const selection = await selectionOptions(v.selector, v.logits, v.candidates, v.keep, index);
  const info = inspectModel(v.model, { context, batch, kvDtype });
  const weightsBytes = Object.values(info.weightBytes).reduce((a, b) => a + (b ?? 0), 0);
  const probe = v["no-probe"] !== true;

  let gpu: DeviceProbe | null = null;
  const gpuFree = v["gpu-free"] === undefined ? undefined : parseSize(v["gpu-free"], "--gpu-free");
  if (gpuFree !== undefined) gpu = { name: "described", freeBytes: gpuFree };
  else gpu = (await probeBackendChoice(device, { bandwidth: probe, ...rankProbe(selection, info, context, int("--k", v.k) ?? 64) })).device;
  if (gpu) {
    const bw = num("--gpu-bandwidth", v["gpu-bandwidth"]), link = num("--link-bandwidth", v["link-bandwidth"]);
    gpu = { ...gpu, ...(bw ? { readBandwidthGBs: bw } : {}), ...(link ? { linkBandwidthGBs: link } : {}) };
  }
  // The CPU stage's threads as the runtime defaults them: its disk-tier reads' depth.
  const stageThreads = defaultStageThreads(gpu !== null);
  const probed = probe ? await probeTiers(await storeTiers(tierOpts), stageThreads, tierOpts.readDepth) : null;
  const tiers: MemoryTier[] = probed ? probed.tiers : await storeTiers(tierOpts);

  const { planRun } = await import("@hybridgen/memtier");
  const plan = planRun({
    model: {
      layers: info.layers, heads: info.heads, kvHeads: info.kvHeads, headDim: info.headDim, weightsBytes, batchRowBytes: info.batchRowBytes,
      queryProjectionBytes: Math.round(info.hiddenSize * info.heads * info.headDim * (weightsBytes / info.parameters)),
    },
    kvElementBytes: kvDtype === "f32" ? 4 : 2, contextTokens: context, batch, gpuKvBudget, leastWindow,
    gpu: gpu ? { freeBytes: gpu.freeBytes, readBandwidthGBs: gpu.readBandwidthGBs, linkBandwidthGBs: gpu.linkBandwidthGBs, indexRankMs: gpu.indexRankMs, indexRankBeside: batch === 1 && gpu.indexRankBeside === true } : undefined,
    tiers, policy: tierOpts.kvPlacement, hostBudgetBytes: tierOpts.hostKvBudget, k: int("--k", v.k) ?? 64,
    ...planSelection(selection, true),
  });
  if (v.json) io.stdout(`${JSON.stringify({ model: v.model, kvDtype, gpuName: gpu?.name ?? null, placementNote: placementNote(tiers), ...plan, store: { diskBytes: plan.store.diskBytes, fits: plan.store.fits, shortfallBytes: plan.store.shortfallBytes, kSpill: plan.store.layout.kSpill ?? null } })}\n`);
  else {
    io.stdout(await formatPlan(v.model, kvDtype, gpu, tiers, tierOpts.kvPlacement, plan, selectionLine(selection), probed?.serialUs));
    // The bytes are the shape's at any length (the scale bench's synthetic KV); generate refuses such a context.
    if (context > info.maxPositions) io.stdout(`note:       ${context} positions exceed the model's max_position_embeddings (${info.maxPositions})\n`);
  }
  if (plan.refusal) throw new HybridgenError(plan.refusal, "ECONTEXT");
  return 0;
}

/**
 * The device index's ranking for the probe to time, when the index may be ranked on the device: its
 * shape over the whole context's pages (what the store's offloaded part can grow to) and the widest
 * layer's want (verified layers rank candidates·K).
 */
function rankProbe(o: HybridRuntimeOptions, info: { layers: number; heads: number; kvHeads: number; headDim: number }, context: number, k: number): { index?: NonNullable<ProbeOptions["index"]> } {
  const m = planSelection(o, true);
  if (!m.index || m.index.placement === "host") return {};
  const pageSize = m.index.pageSize ?? 16, pages = Math.ceil(context / pageSize);
  return { index: { shape: deviceIndexShape(m.index.form ?? "int8", info.kvHeads, info.heads / info.kvHeads, info.headDim, pages), want: indexWant(k * m.candidates, context, pageSize), layers: info.layers } };
}

/**
 * The hybrid options whose byte model the plan takes: --selector (a registered selector; the page
 * index when --index is given), --logits, --candidates and --keep, each checked as generate checks them.
 */
async function selectionOptions(selector: string | undefined, logits: string | undefined, candidates: string | undefined, keep: string | undefined, index: object | undefined): Promise<HybridRuntimeOptions> {
  const o: Record<string, unknown> = {};
  if (selector !== undefined) {
    const { selectorNames } = await import("@hybridgen/selectors");
    if (!selectorNames().includes(selector)) throw new HybridgenError(`invalid value for --selector: "${selector}" is not a registered selector (${selectorNames().join(", ")})`, "EUSAGE");
    if (index && selector !== "index") throw new HybridgenError(`--index goes with --selector index (got --selector ${selector})`, "EUSAGE");
    o.selector = selector;
  }
  if (index) Object.assign(o, { selector: "index", selectorOptions: index });
  for (const [flag, text] of [["logits", logits], ["candidates", candidates], ["keep", keep]] as const) {
    if (text === undefined) continue;
    const [key, value] = parseHybridFlag(flag, text);
    o[key] = value;
  }
  const keepBad = keepProblem(o.keep as number | undefined, (o.logits as LogitsMode | undefined) ?? HYBRID_DEFAULTS.logits, (o.candidates as number | undefined) ?? HYBRID_DEFAULTS.candidates);
  if (keepBad) throw new HybridgenError(keepBad, "EUSAGE");
  return o as HybridRuntimeOptions;
}

/** --index's JSON through the index selector's own schema (one line for a form, page size or placement that does not exist). */
async function indexOptions(raw: string) {
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new HybridgenError(`invalid value for --index: ${JSON.stringify(raw)} is not JSON`, "EUSAGE");
  }
  const { PageIndexOptionsSchema } = await import("@hybridgen/selectors");
  const r = PageIndexOptionsSchema.safeParse(json);
  if (!r.success) {
    const i = r.error.issues[0]!;
    throw new HybridgenError(`invalid value for --index: ${i.path.length ? `${i.path.join(".")}: ` : ""}${i.message}`, "EUSAGE");
  }
  return r.data;
}

/** What the step's stage reads to choose and what its logits send up, in words. */
function selectionLine(o: HybridRuntimeOptions): string {
  const m = planSelection(o, true), name = typeof o.selector === "string" ? o.selector : "the engine's pair";
  const reads = m.index ? "the page index's own bytes" : m.selection === "scan" ? "every offloaded K (a top-K scan)" : m.selection === "bounds" ? `two K rows a page of ${m.boundsPageSize}` : "no K";
  return `select:     ${name} reads ${reads} to choose, then the chosen rows; logits ${o.logits ?? "verified"}${m.candidates > 1 ? ` (${m.candidates}·K candidates go up with their K${m.keep ? `, V rows of ${m.keep}·K` : ""})` : " (K rows of V go up)"}`;
}

async function formatPlan(model: string, kvDtype: DType, gpu: DeviceProbe | null, tiers: readonly MemoryTier[], policy: string, p: RunPlan, select: string, serialUs?: Map<string, number>): Promise<string> {
  const { formatBytes: fb } = await import("@hybridgen/memtier");
  const f = (x: number | null | undefined, d = 2) => (x === null || x === undefined ? "–" : x.toFixed(d));
  const per = p.bytesPerToken.k + p.bytesPerToken.v;
  const lines = [
    `plan:       ${model}, ${kvDtype} KV: ${fb(per)} a token (K ${fb(p.bytesPerToken.k)} + V ${fb(p.bytesPerToken.v)})`,
    `context:    ${p.contextTokens} × batch ${p.batch} = ${fb(per * p.contextTokens * p.batch)} of KV`,
    `weights:    ${fb(p.weights.bytes)} in ${p.weights.where === "gpu" ? "GPU" : "host"} memory`,
    p.gpu
      ? `GPU:        ${gpu?.name ?? "GPU"}: ${fb(p.gpu.freeBytes)} free, ${fb(p.gpu.reserveBytes)} reserved → window ${p.gpu.windowTokens} tokens (${fb(p.gpu.windowBytes)}; ${p.gpu.fitTokens} fit)` +
        `${gpu?.readBandwidthGBs ? `, reads ${f(gpu.readBandwidthGBs, 0)} GB/s` : ""}${gpu?.linkBandwidthGBs ? `, host→device ${f(gpu.linkBandwidthGBs, 1)} GB/s` : ""}` +
        `${gpu?.indexRankMs !== undefined && p.index?.placement === "device" ? `, ranks the index in ${f(gpu.indexRankMs, 3)} ms a layer${p.batch === 1 && gpu.indexRankBeside ? " beside it" : ""}` : ""}`
      : `GPU:        none (the CPU backend: weights and a window of ${p.contextTokens - p.offloadedTokens} tokens, ${fb(p.hostWindowBytes)}, in host memory)`,
    ...(p.gpu
      ? [`reserve:    ${fb(p.gpu.reserveBytes)}: ${p.batch > 1 ? `the batched step's ${p.batch} rows ${fb(p.gpu.batchRowsBytes)}; ` : ""}` +
        `${p.batch > 1 ? `each of the ${p.batch} sequences` : "the sequence"}: score rows ${fb(p.gpu.perSequence.scoresBytes)}, prefill scratch ${fb(p.gpu.perSequence.scratchBytes)}, ` +
        `staging ${fb(p.gpu.perSequence.stagingBytes)}; its window with the ring ${fb(p.gpu.perSequence.windowBytes)}`]
      : []),
    `offloaded:  ${p.offloadedTokens} tokens a sequence: K ${fb(p.offloadedTokens * p.batch * p.bytesPerToken.k)}, V ${fb(p.offloadedTokens * p.batch * p.bytesPerToken.v)}`,
    `placement:  ${policy}; ${placementNote(tiers)}`,
    select,
    ...(p.index ? [`index:      the page index chooses the rows: ${fb(p.index.bytes)} in ${p.index.placement === "device" ? "GPU memory (ranked there; the stage reads only the chosen pages' rows)" : "host memory (the CPU stage searches it)"}`] : []),
    `tier        kind  capacity     usable       K            V            read GB/s`,
    ...p.tiers.map(
      (t) =>
        `${tierKind(t.kind).label(t.id).padEnd(11)} ${t.kind.padEnd(5)} ${fb(t.capacityBytes).padStart(11)}  ${fb(t.availableBytes).padStart(11)}  ${fb(t.kBytes).padStart(11)}  ${fb(t.vBytes).padStart(11)}  ${f(t.readBandwidthGBs, 1).padStart(9)}`,
    ),
    ...(p.store.diskBytes > 0 ? [`disk:       ${fb(p.store.diskBytes)} in files under ${tiers.find((t) => isFileTier(t))?.path}`] : []),
    ...p.tiers.filter((t) => isFileTier(t) && t.kBytes > 0).map((t) =>
      `K on disk:  ${fb(t.kBytes)} (all of V is on disk first), the least recently selected ${fb(p.store.layout.kSpill!.unitBytes)} units; ` +
      `the CPU stage's scoring reads them back every step, through page faults: ${f(p.predicted.kDiskMs)} ms` +
      `${t.faultLatencyUs === undefined ? "" : ` (${f(t.faultLatencyUs, 0)} µs a fault, ${t.faultDepth} in flight)`}`),
    ...tiers.filter((t) => isFileTier(t) && t.readLatencyUs !== undefined).map((t) =>
      `disk reads: ${f(t.readLatencyUs, 0)} µs a row at ${t.readDepth} in flight (the CPU stage's gather)` +
      `${serialUs?.has(t.id) ? `, ${f(serialUs.get(t.id), 0)} µs a random 4 KiB read alone` : ""}`),
    p.predicted.msPerToken === null
      ? `predicted:  – ms/token (a bandwidth is unknown: GPU ${f(p.predicted.gpuMs)}, CPU stage ${f(p.predicted.cpuMs)}, V gather ${f(p.predicted.vGatherMs)}, V transfer ${f(p.predicted.vTransferMs)} ms)`
      : `predicted:  ${f(p.predicted.msPerToken)} ms/${p.batch > 1 ? `step (a token of each of the ${p.batch} sequences: ${f(p.predicted.tokensPerSecond, 1)} tokens/s)` : "token"} = max(GPU ${f(p.predicted.gpuMs)}, CPU stage ${f(p.predicted.cpuMs)}` +
        `${p.predicted.kDiskMs ? ` with K on disk ${f(p.predicted.kDiskMs)}` : ""}) + V gather ${f(p.predicted.vGatherMs)} + V transfer ${f(p.predicted.vTransferMs)} ms`,
  ];
  return `${lines.join("\n")}\n`;
}
