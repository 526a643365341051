/** The host link's capabilities record, checked against its methods, and the spec version every plugin-facing contract carries. */
import { describe, expect, it } from "vitest";
import { checkSpecVersion, hostCapabilities, linkBandwidth, NO_HOST_CAPABILITIES, SPEC_VERSION, type HostTransfers } from "../src/index.js";

const noop = () => {};
/** A link with the required copies, `capabilities` and the optional methods named. */
function link(capabilities: unknown, ...methods: string[]): HostTransfers {
  const l: Record<string, unknown> = { capabilities, pin: noop, unpin: noop, toHost: noop, toDevice: noop, fence: noop, mark: noop, times: () => ({ gpuMs: 0, txMs: 0 }), [Symbol.dispose]: noop };
  for (const m of methods) l[m] = m === "bandwidth" ? () => ({ h2d: 3, d2h: 4 }) : noop;
  return l as unknown as HostTransfers;
}

describe("hostCapabilities", () => {
  it("returns the record a link declares, frozen, when its methods are there", () => {
    const all = { signalledSend: true, gathersRows: true, handOff: true, rowFetch: true, bandwidth: true, keepRows: true };
    const caps = hostCapabilities(link(all, "sendSignalled", "sendSignalledRows", "mapped", "gatherRows", "awaitSignal", "readMapped", "gatherRowsAt", "padColumnsAt", "handOffRows", "rescoreRows", "rowFetch", "bandwidth", "keepRows"));
    expect(caps).toEqual(all);
    expect(Object.isFrozen(caps)).toBe(true);
    expect(hostCapabilities(link(NO_HOST_CAPABILITIES))).toEqual(NO_HOST_CAPABILITIES);
  });

  it("a method present but not claimed stays off: the record, not the method, decides", () => {
    expect(hostCapabilities(link(NO_HOST_CAPABILITIES, "sendSignalled", "mapped", "rowFetch")).signalledSend).toBe(false);
  });

  it("names the first claimed capability whose method is missing, a missing record, and a non-boolean", () => {
    expect(() => hostCapabilities(link({ ...NO_HOST_CAPABILITIES, handOff: true }, "mapped", "awaitSignal", "readMapped", "gatherRowsAt"))).toThrow(
      "host link: capabilities.handOff is true but it has no padColumnsAt() method",
    );
    expect(() => hostCapabilities(link(undefined))).toThrow("host link: it has no capabilities record (HostTransfers.capabilities)");
    expect(() => hostCapabilities(link({ ...NO_HOST_CAPABILITIES, rowFetch: "yes" }))).toThrow('host link: capabilities.rowFetch must be true or false, got "yes"');
  });

  it("linkBandwidth asks only a link that offers it", () => {
    expect(linkBandwidth(link({ ...NO_HOST_CAPABILITIES, bandwidth: true }, "bandwidth"), 1, 1)).toEqual({ h2d: 3, d2h: 4 });
    expect(linkBandwidth(link(NO_HOST_CAPABILITIES, "bandwidth"), 1, 1)).toBeNull();
    expect(linkBandwidth(undefined, 1, 1)).toBeNull();
  });
});

describe("checkSpecVersion", () => {
  it("takes this version or none, and names an implementation written for another", () => {
    expect(() => checkSpecVersion('selector "x"', { spec: SPEC_VERSION })).not.toThrow();
    expect(() => checkSpecVersion('selector "x"', {})).not.toThrow();
    expect(() => checkSpecVersion('selector "x"', { spec: 2 })).toThrow(`selector "x" was written for @hybridgen/spec version 2; this engine implements version ${SPEC_VERSION}`);
    expect(() => hostCapabilities({ ...link(NO_HOST_CAPABILITIES), spec: 9 } as unknown as HostTransfers)).toThrow("host link was written for @hybridgen/spec version 9");
  });
});
