import { HybridgenError, type SelectionInput } from "@hybridgen/spec";

/**
 * Checks what the engine hands a selector before the plugin reads it, so a mismatched head
 * layout or a short buffer is a one-line error rather than silent garbage (typed arrays read
 * past their end as undefined, not as a crash). O(heads) per call.
 */
export function checkSelectionInput(input: SelectionInput<unknown>, who: string): void {
  const { offloaded, k, layout, positions } = input;
  const bad = (msg: string): never => {
    throw new HybridgenError(`${who}: bad input at layer ${input.layer}, step ${input.step}: ${msg}`);
  };
  if (!Number.isInteger(offloaded) || offloaded < 0) bad(`offloaded must be a non-negative integer, got ${offloaded}`);
  if (!Number.isInteger(k) || k < 0 || k > offloaded) bad(`k=${k} must lie in [0, offloaded=${offloaded}] (the engine clamps K)`);
  if (layout.heads !== layout.kvHeads * layout.groupSize) bad(`head layout ${layout.heads} heads ≠ ${layout.kvHeads} KV heads × group ${layout.groupSize}`);
  if (positions.length < offloaded) bad(`positions has ${positions.length} entries for ${offloaded} offloaded tokens`);
  if (input.query.length !== layout.heads * layout.headDim) {
    bad(`query has ${input.query.length} values, expected heads × headDim = ${layout.heads * layout.headDim}`);
  }
  if (input.timing === "post") {
    if (input.logits.length !== layout.heads) bad(`post-QKᵀ logits have ${input.logits.length} rows, expected one per query head (${layout.heads})`);
    input.logits.forEach((row, h) => {
      if (row.length < offloaded) bad(`logits of head ${h} hold ${row.length} values for ${offloaded} offloaded tokens`);
    });
  }
  const scores = input.scores;
  if (scores) {
    if (scores.perKvHead.length !== layout.kvHeads) bad(`accumulated scores have ${scores.perKvHead.length} rows, expected one per KV head (${layout.kvHeads})`);
    scores.perKvHead.forEach((row, g) => {
      if (row.length < offloaded) bad(`accumulated scores of KV head ${g} hold ${row.length} values for ${offloaded} offloaded tokens`);
    });
  }
}
