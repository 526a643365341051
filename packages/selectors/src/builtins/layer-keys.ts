import type { OffloadedKeys, SelectionInput } from "@hybridgen/spec";

/** The layer's offloaded K rows, checked against the head layout (selectors that read keys). */
export function layerKeys(input: SelectionInput<unknown>): OffloadedKeys {
  const keys = input.keys;
  if (!keys) throw new Error("needs the layer's offloaded keys, and the engine passed none (a CPU stage without offloadedKeys())");
  const { kvHeads, headDim } = input.layout;
  if (keys.kvHeads !== kvHeads || keys.headDim !== headDim || keys.capacity < input.offloaded) {
    throw new Error(`offloaded keys [${keys.kvHeads}, ${keys.capacity}, ${keys.headDim}] do not match ${kvHeads} KV heads × headDim ${headDim} with ${input.offloaded} offloaded`);
  }
  return keys;
}
