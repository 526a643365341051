/**
 * The transport of a new hybrid attention: what the backend's host link, the CPU stage and the
 * store offer, read once (the only place that asks), then chooseTransport's pick, built.
 */
import type { Attention } from "@hybridgen/core";
import { DTYPE_BYTES, type HostTransfers, type Tensor, fail, hostCapabilities, type HostTransferCapabilities } from "@hybridgen/spec";
import type { KvCache } from "@hybridgen/core";
import type { RowPathRequest } from "../row-path.js";
import { chooseTransport, type TransportChoice } from "./choose-transport.js";
import { DeviceStaging } from "./device-staging.js";
import { HandedOffTransport } from "./handed-off-transport.js";
import { HostTransport } from "./host-transport.js";
import { MappedTransport } from "./mapped-transport.js";
import { StagedTransport } from "./staged-transport.js";
import type { StepDriver, StepTransport } from "./step-transport.js";

export interface TransportOptions {
  readonly rowPath: RowPathRequest;
  readonly trackScores: boolean;
  /** Rows per KV head the device's row buffers start with. */
  readonly rows: number;
  /** The window is materialised (no flash-decode partial): the device's score rows span the context. */
  readonly wholeRows: boolean;
}

export function openTransport(step: StepDriver, attention: Attention, o: TransportOptions): { transport: StepTransport; choice: TransportChoice } {
  const cache = attention.cache, link = cache.hostLink;
  const request = { rowPath: o.rowPath, trackScores: o.trackScores };
  const recordsSteps = attention.backend.beginStep !== undefined && attention.backend.endStep !== undefined;
  const noKeep = (why: string) => fail(`invalid hybrid option keep: a handed-off step keeps candidates on the device, with the link's keepRows; ${why}`);
  if (!link) {
    const choice = chooseTransport({ link: null, recordsSteps, layersMapped: [], rowBytes: 0, stageSignals: false, stageQueuesStep: false }, request);
    return { transport: new HostTransport(step, attention), choice };
  }
  const { heads, headDim } = step.layout;
  const d = new DeviceStaging(attention.backend, cache, step.stage, heads, headDim, { rows: o.rows, keys: step.rescore.includes(true), wholeRows: o.wholeRows });
  try {
    const host = cache.hostBackend;
    // The device gathers only from store tensors whose host memory it can name.
    const caps = { ...hostCapabilities(link), ...(typeof host?.hostRegion === "function" ? {} : { gathersRows: false }) };
    const stageSignals = step.stage.waitsForSignal === true && d.queriesMapped();
    const queues = (step.stage.queueDepth ?? 1) >= cache.layers;
    const choice = chooseTransport({
      link: caps, recordsSteps, layersMapped: layersMapped(cache, link, caps, step.rescore), rowBytes: cache.headDim * DTYPE_BYTES[cache.dtype],
      stageSignals,
      // The done word is pinned only where a hand-off could use it.
      stageQueuesStep: caps.handOff && stageSignals && queues && d.tablesMapped() && d.pinDoneWord(),
    }, request);
    // The staged and mapped transports keep wherever they can (the host drops the rest where the device cannot); a hand-off needs the link's.
    if (step.keeps && choice.name === "handed-off" && !caps.keepRows) noKeep("this link has none");
    const T = choice.name === "handed-off" ? HandedOffTransport : choice.name === "mapped" ? MappedTransport : StagedTransport;
    return { transport: new T(step, d, attention, choice), choice };
  } catch (e) {
    d.close();
    throw e;
  }
}

/** Per layer: its V store (and K store, where it verifies) is pinned host memory the device maps. */
function layersMapped(cache: KvCache, link: HostTransfers, caps: HostTransferCapabilities, keys: readonly boolean[]): boolean[] {
  const host = cache.hostBackend;
  if (!caps.gathersRows || !host?.hostRegion) return new Array(cache.layers).fill(false);
  const isMapped = (t: Tensor) => link.mapped!(host.hostRegion!(t));
  return Array.from({ length: cache.layers }, (_, l) => isMapped(cache.stageStoreV(l)) && (!keys[l] || isMapped(cache.stageStoreK(l))));
}
