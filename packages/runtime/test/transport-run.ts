/**
 * One tiny model decoded through each transport's setting, for the transport tests: "host" (no host
 * link: the backend reads the stage's buffers), "copies" (a loopback link that only copies),
 * "gathers" (a link that gathers rows from the mapped host store and sends queries signalled, a
 * stage without a queue), "queue" (the same link and a stage that queues a step: the hand-off),
 * "queue+fetch" (and the link fetches rows ahead on a side stream). The device records its steps.
 */
import { expect } from "vitest";
import { BackendCpuStage, LlamaModel, ReferenceBackend, type HostRegion, type ModelFiles, type SelectionTiming, type TokenSelector } from "@hybridgen/core";
import { HybridAttention, type LogitsMode, type RowPathRequest } from "../src/index.js";
import { fixedScheduler } from "./hybrid-helpers.js";
import { HandoffLink, QueuedStage } from "./handoff-link.js";
import { AddressBook, HostReference, LoopbackLink, StagedBackendCpuStage } from "@hybridgen/core/testing";
import { Recorder } from "./recorder.js";

export const CONTEXT = 40, PROMPT = 12, LAYERS = 3, STEPS = CONTEXT - PROMPT;

export type Setting = "host" | "copies" | "gathers" | "queue" | "queue+fetch";

export interface TransportCase {
  readonly logits: LogitsMode;
  readonly selector: () => TokenSelector;
  readonly timing: SelectionTiming;
  readonly k: number;
  readonly rowPath?: RowPathRequest;
  readonly trackScores?: boolean;
  /** Verified layers keep keep·K of their candidates (HybridOptions.keep). */
  readonly keep?: number;
  /** Layers whose store V the link does not map. */
  readonly unmappedV?: readonly number[];
}

/** HandoffLink maps every pinned region but those of `unmapped`. */
class PartlyMappedLink extends HandoffLink {
  readonly unmapped = new Set<number>();
  override mapped(r?: HostRegion): boolean {
    return r === undefined || !this.unmapped.has(r.address);
  }
}

export function runTransport(files: ModelFiles, tokens: readonly number[], setting: Setting, c: TransportCase) {
  const be = new ReferenceBackend(), book = new AddressBook(), host = new HostReference(book), rec = new Recorder();
  // The recorder gives the device beginStep/endStep: a backend that records steps, as a hand-off needs.
  const model = LlamaModel.load(files, rec.wrap(be), { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: 6, sinkTokens: 1, kvEvictBlock: 2 });
  let stage: BackendCpuStage;
  if (setting === "host") {
    stage = new BackendCpuStage(be);
  } else if (setting === "copies") {
    model.cache.attachHostStore(host, new LoopbackLink(be, host, book));
    stage = new StagedBackendCpuStage(host, book);
  } else {
    const link = new PartlyMappedLink(be, host, book, rec, { rowFetch: setting === "queue+fetch" });
    model.cache.attachHostStore(host, link);
    for (const l of c.unmappedV ?? []) link.unmapped.add(host.hostRegion(model.cache.stageStoreV(l)).address);
    stage = setting === "gathers" ? new StagedBackendCpuStage(host, book) : new QueuedStage(host, book, link);
  }
  let hybrid: HybridAttention;
  try {
    hybrid = HybridAttention.attach(
      { attention: model.attention, projector: model, stage, selector: c.selector(), scheduler: fixedScheduler(c.k, c.timing) },
      { logits: c.logits, rowPath: c.rowPath, trackScores: c.trackScores, ...(c.keep === undefined ? {} : { keep: c.keep }) });
  } catch (e) {
    stage.close();
    model.close();
    throw e;
  }
  const out = [model.forward(Int32Array.from(tokens.slice(0, PROMPT)), 0)];
  for (let t = PROMPT; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t));
  const result = { out, name: hybrid.transportName, choice: hybrid.transportChoice, summary: hybrid.stats.summary(), handedOff: hybrid.stats.handedOffSteps };
  hybrid.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  return result;
}
