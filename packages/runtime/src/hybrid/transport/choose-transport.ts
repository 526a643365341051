/**
 * Which transport carries a hybrid step: one pure function of what the backend's host link can do,
 * what the CPU stage and the store allow, and the options — decided once, when the hybrid attention
 * is made, as llama.cpp picks a kernel for a device and a shape. Per layer, chooseRowPath decides
 * whether its rows are mapped or staged; the transport is the most direct way every layer allows.
 */
import { fail, type HostTransferCapabilities } from "@hybridgen/spec";
import { chooseRowPath, type RowPath, type RowPathRequest } from "../row-path.js";
import type { TransportName } from "./step-transport.js";

export interface TransportFacts {
  /** The host link's capabilities; null: the backend reads the stage's buffers itself (no host link). */
  readonly link: HostTransferCapabilities | null;
  /** The backend records decode steps (beginStep/endStep). */
  readonly recordsSteps: boolean;
  /** Per layer: the store regions its rows come from (V; K too where it verifies) are pinned and mapped. */
  readonly layersMapped: readonly boolean[];
  /** Bytes of one store row. */
  readonly rowBytes: number;
  /** The stage waits for signals and its query buffers are mapped (a signalled send may land there). */
  readonly stageSignals: boolean;
  /** The stage queues a whole step's jobs and raises their done signals in a mapped word; its logits and tables are mapped. */
  readonly stageQueuesStep: boolean;
}

export interface TransportRequest {
  readonly rowPath: RowPathRequest;
  /** Accumulated scores are tracked: every probability is read back, so no step is recorded. */
  readonly trackScores: boolean;
}

export interface TransportChoice {
  readonly name: TransportName;
  /** Handed off: rows are fetched ahead on the link's side stream. */
  readonly fetchAhead: boolean;
  /** Queries go to the stage by signalled sends (no host fence). */
  readonly signals: boolean;
  /** The device work between host interactions is recorded as one segment a layer. */
  readonly records: boolean;
  /** Per layer, how its rows come up (empty for the host transport). */
  readonly rowPaths: readonly RowPath[];
  /** Why the first staged layer is staged ("" when none is). */
  readonly stagedReason: string;
}

export function chooseTransport(f: TransportFacts, r: TransportRequest): TransportChoice {
  const link = f.link;
  if (!link) return { name: "host", fetchAhead: false, signals: false, records: false, rowPaths: [], stagedReason: "" };
  let stagedReason = "";
  const rowPaths = f.layersMapped.map((mapped, l) => {
    const c = chooseRowPath({ request: r.rowPath, deviceGathers: link.gathersRows, mapped, rowBytes: f.rowBytes });
    if (c.path === "staged" && !stagedReason) stagedReason = c.reason;
    if (r.rowPath === "mapped" && c.path !== "mapped") fail(`hybrid attention: rowPath "mapped" cannot run on layer ${l}: ${c.reason}`);
    return c.path;
  });
  const signals = link.signalledSend && f.stageSignals;
  const records = f.recordsSteps && !r.trackScores;
  const allMapped = rowPaths.every((p) => p === "mapped");
  const handsOff = allMapped && signals && records && link.handOff && f.stageQueuesStep;
  const name: TransportName = handsOff ? "handed-off" : rowPaths.includes("mapped") ? "mapped" : "staged";
  return { name, fetchAhead: handsOff && link.rowFetch, signals, records, rowPaths, stagedReason };
}

/** The stats line's words on the transport, e.g. "transport mapped: V rows read by the device from pinned host memory (32 of 32 layers)". */
export function transportNote(c: TransportChoice): string {
  const paths = c.rowPaths, mapped = paths.filter((p) => p === "mapped").length;
  const name = `transport ${c.name}${c.fetchAhead ? " (rows fetched ahead)" : ""}`;
  if (c.name === "host") return name;
  const ahead = c.fetchAhead ? ", fetched ahead on a side stream in handed-off steps" : "";
  if (mapped === paths.length) return `${name}: V rows read by the device from pinned host memory (${mapped} of ${paths.length} layers)${ahead}`;
  return `${name}: V rows staged by the CPU stage on ${paths.length - mapped} of ${paths.length} layers (${c.stagedReason})`;
}
