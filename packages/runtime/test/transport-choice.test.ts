/** chooseTransport: which transport carries a hybrid step, from the link's capabilities, the stage and store facts, and the options. */
import { describe, expect, it } from "vitest";
import { type HostTransferCapabilities } from "@hybridgen/core";
import { chooseTransport, transportNote, type TransportFacts } from "../src/index.js";

const every: HostTransferCapabilities = { signalledSend: true, gathersRows: true, handOff: true, rowFetch: true, bandwidth: true, keepRows: true };
const facts = (o: Partial<TransportFacts> = {}): TransportFacts => ({
  link: every, recordsSteps: true, layersMapped: [true, true, true], rowBytes: 128, stageSignals: true, stageQueuesStep: true, ...o,
});
const auto = { rowPath: "auto" as const, trackScores: false };

describe("chooseTransport", () => {
  it("no host link: the host transport, nothing recorded, no row paths", () => {
    const c = chooseTransport(facts({ link: null }), auto);
    expect(c).toEqual({ name: "host", fetchAhead: false, signals: false, records: false, rowPaths: [], stagedReason: "" });
    expect(transportNote(c)).toBe("transport host");
  });

  it("everything offered: handed off, rows fetched ahead where the link has a side stream", () => {
    const c = chooseTransport(facts(), auto);
    expect(c).toMatchObject({ name: "handed-off", fetchAhead: true, signals: true, records: true, rowPaths: ["mapped", "mapped", "mapped"] });
    expect(transportNote(c)).toBe("transport handed-off (rows fetched ahead): V rows read by the device from pinned host memory (3 of 3 layers), fetched ahead on a side stream in handed-off steps");
    expect(chooseTransport(facts({ link: { ...every, rowFetch: false } }), auto)).toMatchObject({ name: "handed-off", fetchAhead: false });
  });

  it("a hand-off needs every layer mapped, signalled queries, recorded steps, the link's ops and a stage that queues a step: else mapped", () => {
    const mapped = (f: TransportFacts, trackScores = false) => expect(chooseTransport(f, { rowPath: "auto", trackScores }).name).toBe("mapped");
    mapped(facts({ layersMapped: [true, false, true] }));
    mapped(facts({ stageSignals: false }));
    mapped(facts({ link: { ...every, signalledSend: false } }));
    mapped(facts({ recordsSteps: false }));
    mapped(facts(), true); // tracked scores read every probability back: nothing is recorded
    mapped(facts({ link: { ...every, handOff: false } }));
    mapped(facts({ stageQueuesStep: false }));
  });

  it("rows are staged where the device cannot gather them, and a layer the link does not map stays staged", () => {
    const none = chooseTransport(facts({ link: { ...every, gathersRows: false } }), auto);
    expect(none).toMatchObject({ name: "staged", rowPaths: ["staged", "staged", "staged"], stagedReason: "the device backend cannot gather rows from host memory" });
    expect(transportNote(none)).toBe("transport staged: V rows staged by the CPU stage on 3 of 3 layers (the device backend cannot gather rows from host memory)");
    const mixed = chooseTransport(facts({ layersMapped: [true, false, true] }), auto);
    expect(mixed).toMatchObject({ name: "mapped", rowPaths: ["mapped", "staged", "mapped"] });
    expect(transportNote(mixed)).toMatch(/^transport mapped: V rows staged by the CPU stage on 1 of 3 layers \(the store's rows are not in pinned host memory/);
    expect(chooseTransport(facts({ rowBytes: 40 }), auto).stagedReason).toBe("a row of 40 bytes is not a whole number of 16-byte pieces");
  });

  it("rowPath: staged asked for is staged everywhere; mapped asked for where a layer cannot map is an error naming the layer", () => {
    expect(chooseTransport(facts(), { rowPath: "staged", trackScores: false })).toMatchObject({ name: "staged", stagedReason: "staged rows asked for" });
    expect(() => chooseTransport(facts({ layersMapped: [true, true, false] }), { rowPath: "mapped", trackScores: false }))
      .toThrow(/rowPath "mapped" cannot run on layer 2: the store's rows are not in pinned host memory/);
  });

  it("is a pure function: the same facts give the same choice", () => {
    const f = facts({ layersMapped: [true, false, true] });
    expect(chooseTransport(f, auto)).toEqual(chooseTransport(f, auto));
  });
});
