/**
 * Backends by name, beside @hybridgen/selectors' registerSelector and @hybridgen/scheduler's
 * registerScheduler: "cpu" (@hybridgen/kernels-cpu) and "cuda" (@hybridgen/kernels-cuda, when
 * installed) are registered here, a plugin adds its own, and the CLI, the benches and any program
 * open one through openBackend, so no caller lists the names or imports a backend package itself.
 */
import { resolve as resolvePath } from "node:path";
import { pathToFileURL } from "node:url";
import { z } from "zod";
import { HybridgenError, linkBandwidth, type Backend, type DeviceIndexShape } from "@hybridgen/spec";
import { timeIndexRank } from "./hybrid/device-index.js";

/** What a backend is opened with: the knobs every caller has, and the backend's own options. */
export interface BackendOpenOptions {
  /** CPU threads for a backend with a thread pool (default: the backend's). */
  readonly threads?: number;
  /** Bytes of device memory the backend may use (CUDA's arena; the CPU backend's cap on its "device" memory). */
  readonly memoryBytes?: number;
  /** The backend's own options (kernels-cuda's CudaBackendOptions, kernels-cpu's CpuBackendOptions), over the two above. */
  readonly options?: Readonly<Record<string, unknown>>;
}

export interface OpenedBackend {
  readonly backend: Backend;
  /** "cpu/avx2", "cuda/NVIDIA H100 80GB HBM3", a plugin's own. */
  readonly device: string;
  /** CPU threads the backend runs (1 for a device backend). */
  readonly threads: number;
}

export type BackendAvailability = { readonly available: true } | { readonly available: false; readonly reason: string };

/** What a device backend measures before it takes any memory: the device the planner sizes a run for. */
export interface DeviceProbe {
  readonly name: string;
  /** Device memory free before any arena is taken. */
  readonly freeBytes: number;
  /** Device → device copy bandwidth (read + write bytes a second, ÷ 1e9), when measured. */
  readonly readBandwidthGBs?: number;
  /** Host → device copy bandwidth (GB/s), when measured. */
  readonly linkBandwidthGBs?: number;
  /** ms one layer's ranking of the probe's `index` takes (timeIndexRank), when asked and measured. */
  readonly indexRankMs?: number;
  /** A sequence's rankings run on a side stream beside the rest of its layer (Backend.beginSide), with indexRankMs. */
  readonly indexRankBeside?: boolean;
}

/** What a probe measures: the copy bandwidths, and with `index` (and `bandwidth`) a device index's ranking at that shape. */
export interface ProbeOptions {
  readonly bandwidth: boolean;
  readonly index?: { readonly shape: DeviceIndexShape; readonly want: number; readonly layers: number };
}

/** What a backend finds on this machine: one line for `hybridgen info`, and the details its --json carries. */
export interface BackendDescription {
  readonly available: boolean;
  readonly summary: string;
  readonly detail?: unknown;
}

export interface BackendEntry {
  readonly name: string;
  /** Whether it can open here and why not (default: always); "auto" skips one that cannot. */
  readonly availability?: () => BackendAvailability | Promise<BackendAvailability>;
  /** "auto" tries the backends with a rank, highest first (cuda 1, cpu 0); none: only by name. */
  readonly autoRank?: number;
  /** Opens it; a failure is the error of openBackend(name) and, under "auto", a reason to try the next. */
  readonly open: (options: BackendOpenOptions) => OpenedBackend | Promise<OpenedBackend>;
  /** What it finds on this machine (`hybridgen info` lists the backends that have one). */
  readonly describe?: () => BackendDescription | Promise<BackendDescription>;
  /**
   * Its device's free memory and, with `bandwidth`, its copy bandwidths, measured before anything is allocated (`hybridgen
   * plan`, `bench --workload`); null: it computes in host memory, so a plan has no device. None: it cannot be planned for.
   */
  readonly probe?: (options: ProbeOptions) => Promise<DeviceProbe | null>;
}

const registry = new Map<string, BackendEntry>();

/** Adds a backend under `entry.name`; a name taken (or "auto") is an error. */
export function registerBackend(entry: BackendEntry): void {
  if (!/^[a-z][a-z0-9-]*$/.test(entry.name)) throw new HybridgenError(`registerBackend: name "${entry.name}" must be lower-case kebab-case`);
  if (entry.name === "auto") throw new HybridgenError(`registerBackend: "auto" picks among the registered backends and cannot be one`);
  if (registry.has(entry.name)) throw new HybridgenError(`registerBackend: "${entry.name}" is registered already`);
  if (typeof entry.open !== "function") throw new HybridgenError(`registerBackend("${entry.name}"): open must be a function`);
  registry.set(entry.name, entry);
}

/** The registered names, built-ins first. */
export function backendNames(): string[] {
  return [...registry.keys()];
}

/** The entry for `name`, or a one-line error naming the registered ones. */
export function lookupBackend(name: string): BackendEntry {
  const e = registry.get(name);
  if (!e) throw new HybridgenError(`unknown backend "${name}" (registered: ${backendNames().join(", ")}; or auto)`);
  return e;
}

/** What openBackend opened, and for "auto" why the higher-ranked ones were passed over. */
export interface OpenedBackendChoice extends OpenedBackend {
  readonly name: string;
  /** Under "auto": each backend passed over, with its reason (empty when the first one opened). */
  readonly skipped: readonly { readonly name: string; readonly reason: string }[];
}

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

/**
 * Opens the backend `name` names, or under "auto" the highest-ranked one that is available here and
 * opens (each one passed over is in `skipped`, with its reason). An unknown name is a one-line error
 * naming the registered ones; a named backend that cannot open fails with its own error.
 */
export async function openBackend(name: string, options: BackendOpenOptions = {}): Promise<OpenedBackendChoice> {
  if (name !== "auto") return { ...(await opened(lookupBackend(name), options)), name, skipped: [] };
  const ranked = [...registry.values()].filter((e) => e.autoRank !== undefined).sort((a, b) => b.autoRank! - a.autoRank!);
  const skipped: { name: string; reason: string }[] = [];
  for (const entry of ranked) {
    const a = (await entry.availability?.()) ?? { available: true };
    if (!a.available) {
      skipped.push({ name: entry.name, reason: a.reason });
      continue;
    }
    try {
      return { ...(await opened(entry, options)), name: entry.name, skipped };
    } catch (e) {
      skipped.push({ name: entry.name, reason: message(e) });
    }
  }
  throw new HybridgenError(`no backend could be opened (${skipped.map((s) => `${s.name}: ${s.reason}`).join("; ") || "none registered for auto"})`);
}

/** What an entry opened, checked: a plugin that returns no backend is its error, not the engine's. */
async function opened(entry: BackendEntry, options: BackendOpenOptions): Promise<OpenedBackend> {
  const o = await entry.open(options);
  if (!o || typeof o !== "object" || !o.backend || typeof o.backend.alloc !== "function" || typeof o.device !== "string") {
    throw new HybridgenError(`backend "${entry.name}": open() must return { backend, device, threads } with a Backend`);
  }
  return o;
}

/** What probeBackend found: the backend a plan is for, its device (null: host memory alone), and under "auto" what was passed over. */
export interface ProbedBackend {
  readonly name: string;
  readonly device: DeviceProbe | null;
  readonly skipped: readonly { readonly name: string; readonly reason: string }[];
}

/**
 * Probes the backend `name` names (unavailable, or without a probe: a one-line error), or under "auto" the highest-ranked
 * available one that has a probe (each one passed over in `skipped`, with its reason).
 */
export async function probeBackend(name: string, options: ProbeOptions): Promise<ProbedBackend> {
  const noProbe = (e: BackendEntry) => `backend "${e.name}" cannot be probed for a plan (its entry has no probe): give the device's free memory`;
  if (name !== "auto") {
    const entry = lookupBackend(name);
    const a = (await entry.availability?.()) ?? { available: true };
    if (!a.available) throw new HybridgenError(a.reason);
    if (!entry.probe) throw new HybridgenError(noProbe(entry));
    return { name, device: await entry.probe(options), skipped: [] };
  }
  const skipped: { name: string; reason: string }[] = [];
  for (const entry of [...registry.values()].filter((e) => e.autoRank !== undefined).sort((a, b) => b.autoRank! - a.autoRank!)) {
    const a = (await entry.availability?.()) ?? { available: true };
    if (!a.available) skipped.push({ name: entry.name, reason: a.reason });
    else if (!entry.probe) skipped.push({ name: entry.name, reason: noProbe(entry) });
    else return { name: entry.name, device: await entry.probe(options), skipped };
  }
  throw new HybridgenError(`no backend could be probed (${skipped.map((s) => `${s.name}: ${s.reason}`).join("; ") || "none registered for auto"})`);
}

/** Each registered backend that describes itself, in registration order (built-ins first). */
export async function describeBackends(): Promise<({ readonly name: string } & BackendDescription)[]> {
  const out: ({ readonly name: string } & BackendDescription)[] = [];
  for (const e of registry.values()) if (e.describe) out.push({ name: e.name, ...(await e.describe()) });
  return out;
}

const MiB = 2 ** 20;

registerBackend({
  name: "cpu",
  autoRank: 0,
  probe: async () => null,
  open: async ({ threads, memoryBytes, options }) => {
    const { createCpuBackend } = await import("@hybridgen/kernels-cpu");
    const backend = createCpuBackend({ ...(threads === undefined ? {} : { threads }), ...(memoryBytes === undefined ? {} : { memoryCapBytes: memoryBytes }), ...options });
    return { backend, device: `cpu/${backend.isa}`, threads: backend.threads };
  },
});

/** kernels-cuda, or why it cannot load (an optional peer: a CPU-only install leaves it out). */
async function cudaPackage() {
  try {
    return await import("@hybridgen/kernels-cuda");
  } catch (e) {
    return `@hybridgen/kernels-cuda cannot be loaded (${message(e).split("\n")[0]})`;
  }
}

registerBackend({
  name: "cuda",
  autoRank: 1,
  availability: async () => {
    const cuda = await cudaPackage();
    if (typeof cuda === "string") return { available: false, reason: cuda };
    const a = cuda.cudaAvailability();
    return a.available ? { available: true } : { available: false, reason: cuda.describeCudaAvailability(a) };
  },
  open: async ({ memoryBytes, options }) => {
    const cuda = await cudaPackage();
    if (typeof cuda === "string") throw new HybridgenError(cuda);
    const backend = cuda.createCudaBackend({ ...(memoryBytes === undefined ? {} : { arenaBytes: memoryBytes }), ...options });
    return { backend, device: `cuda/${backend.device.name}`, threads: 1 };
  },
  describe: async () => {
    const cuda = await cudaPackage();
    if (typeof cuda === "string") return { available: false, summary: cuda };
    const a = cuda.cudaAvailability();
    return { available: a.available, summary: cuda.describeCudaAvailability(a), detail: a };
  },
  // Device 0's free memory (cudaMemGetInfo) before any arena; its bandwidths (and an index's ranking) on a small arena of their own.
  probe: async ({ bandwidth, index }) => {
    const cuda = await cudaPackage();
    if (typeof cuda === "string") throw new HybridgenError(cuda);
    const a = cuda.cudaAvailability();
    if (!a.available) throw new HybridgenError(a.reason);
    const out = new Float64Array(2);
    const rc = cuda.openCudaNative(a.libraryPath).hg_cu_mem_info(0, out);
    if (rc !== 0) throw new HybridgenError(`CUDA device 0: cannot read its free memory (error ${rc})`);
    const device: DeviceProbe = { name: a.devices[0]?.name ?? "CUDA device 0", freeBytes: out[0]! };
    if (!bandwidth) return device;
    const indexBytes = index ? index.shape.scalesOffset + index.shape.pageCapacity * index.shape.kvHeads * 4 : 0;
    using be = cuda.createCudaBackend({ arenaBytes: 1024 * MiB + Math.ceil(indexBytes / MiB) * MiB });
    const copy = be.copyBandwidth(256 * MiB, 10);
    const link = linkBandwidth(be.hostTransfers(), 256 * MiB, 5);
    const rank = index ? { indexRankMs: timeIndexRank(be, index.shape, index.want, index.layers), indexRankBeside: be.beginSide !== undefined } : {};
    return { ...device, readBandwidthGBs: copy / 1e9, ...(link ? { linkBandwidthGBs: link.h2d / 1e9 } : {}), ...rank };
  },
});

/** Whether a --device value names a module file rather than a registered backend. */
export const isBackendModule = (ref: string): boolean => /^(\.{1,2}\/|\/)/.test(ref) || /\.(ts|js|mjs)$/.test(ref);

/**
 * Loads a backend plugin module (its default export, or `PATH:export`, a BackendEntry), registers it
 * unless that entry is registered already, and returns its name; every failure is one line naming the module.
 */
export async function loadBackendModule(ref: string, cwd: string = process.cwd()): Promise<string> {
  const colon = ref.lastIndexOf(":");
  const [path, key] = colon > 1 ? [ref.slice(0, colon), ref.slice(colon + 1)] : [ref, "default"];
  const file = resolvePath(cwd, path);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (e) {
    throw new HybridgenError(`backend "${ref}": loading ${file} failed: ${message(e).split("\n")[0]}`);
  }
  const entry = mod[key] as BackendEntry | undefined;
  if (!entry || typeof entry !== "object" || typeof entry.name !== "string" || typeof entry.open !== "function") {
    throw new HybridgenError(`backend "${ref}": export "${key}" is not a backend entry ({ name, open(options) })`);
  }
  if (registry.get(entry.name) !== entry) registerBackend(entry);
  return entry.name;
}

/** What a --device value may be, for an error: "auto", a registered backend, or a backend module. */
export const backendChoices = (): string => `one of auto, ${backendNames().join(", ")} or a backend module (./my-backend.ts)`;

/** --device's value: "auto", a registered backend's name or a backend module's path; otherwise "must be one of …". */
export const BackendChoiceSchema = z.string().superRefine((v, ctx) => {
  // An invalid value of this option (not a cross-option refine): callers name the flag before the message.
  if (v !== "auto" && !isBackendModule(v) && !registry.has(v)) ctx.addIssue({ code: "invalid_value", values: ["auto", ...backendNames()], input: v, message: `must be ${backendChoices()}` });
});

/** openBackend for a --device value: a backend module is loaded (and registered) first. */
export async function openBackendChoice(choice: string, options: BackendOpenOptions = {}, cwd?: string): Promise<OpenedBackendChoice> {
  return openBackend(isBackendModule(choice) ? await loadBackendModule(choice, cwd) : choice, options);
}

/** probeBackend for a --device value: a backend module is loaded (and registered) first. */
export async function probeBackendChoice(choice: string, options: ProbeOptions, cwd?: string): Promise<ProbedBackend> {
  return probeBackend(isBackendModule(choice) ? await loadBackendModule(choice, cwd) : choice, options);
}
