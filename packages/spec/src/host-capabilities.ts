/**
 * The host link's capabilities record, read once: the engine branches on it, never on which
 * optional HostTransfers methods an object happens to carry. A record that claims a capability
 * whose methods are missing is the link's bug, named in one line before any step runs.
 */
import type { HostTransferCapabilities, HostTransfers } from "./backend.js";
import { fail } from "./errors.js";
import { checkSpecVersion } from "./version.js";

/** A link that offers nothing beyond the copies every link makes. */
export const NO_HOST_CAPABILITIES: HostTransferCapabilities = Object.freeze({
  signalledSend: false,
  gathersRows: false,
  handOff: false,
  rowFetch: false,
  bandwidth: false,
  keepRows: false,
});

/** The optional methods each capability promises. */
export const CAPABILITY_METHODS: Readonly<Record<keyof HostTransferCapabilities, readonly (keyof HostTransfers)[]>> = {
  signalledSend: ["sendSignalled", "sendSignalledRows", "mapped"],
  gathersRows: ["mapped", "gatherRows"],
  handOff: ["mapped", "awaitSignal", "readMapped", "gatherRowsAt", "padColumnsAt", "handOffRows", "rescoreRows"],
  rowFetch: ["rowFetch"],
  bandwidth: ["bandwidth"],
  keepRows: ["mapped", "rescoreRows", "keepRows"],
};

/** `link`'s capabilities, checked against its methods (a one-line error names the first gap), as a frozen copy. */
export function hostCapabilities(link: HostTransfers): HostTransferCapabilities {
  checkSpecVersion("host link", link);
  const caps = (link as { capabilities?: unknown }).capabilities;
  if (typeof caps !== "object" || caps === null) fail("host link: it has no capabilities record (HostTransfers.capabilities)");
  const out = {} as Record<keyof HostTransferCapabilities, boolean>;
  for (const key of Object.keys(CAPABILITY_METHODS) as (keyof HostTransferCapabilities)[]) {
    const v = (caps as Record<string, unknown>)[key];
    if (typeof v !== "boolean") fail(`host link: capabilities.${key} must be true or false, got ${JSON.stringify(v)}`);
    if (v) {
      const missing = CAPABILITY_METHODS[key].find((m) => typeof link[m] !== "function");
      if (missing) fail(`host link: capabilities.${key} is true but it has no ${String(missing)}() method`);
    }
    out[key] = v;
  }
  return Object.freeze(out);
}

/** The link's pinned copy bandwidth in bytes/s (bandwidth()), or null where its capabilities offer none. */
export function linkBandwidth(link: HostTransfers | undefined, bytes: number, iters: number): { h2d: number; d2h: number } | null {
  return link?.capabilities.bandwidth ? link.bandwidth!(bytes, iters) : null;
}
