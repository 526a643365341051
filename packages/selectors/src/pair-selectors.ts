/**
 * The paper's arrangement (§4.5): a score-based selector while the scheduler picks post-QKᵀ,
 * a cheap predictor when it switches to pre-QKᵀ. pairSelectors() makes one TokenSelector of
 * the two that dispatches on the timing of each call, each half keeping its own state.
 */
import { HybridgenError, type Selection, type SelectionInput, type SelectorLayerInfo, type TokenSelector } from "@hybridgen/core";

export interface PairState {
  readonly post: unknown;
  readonly pre: unknown;
}

export function pairSelectors(parts: { post: TokenSelector<any>; pre: TokenSelector<any> }): TokenSelector<PairState> {
  const { post, pre } = parts;
  if (!post.timings.includes("post")) throw new HybridgenError(`pairSelectors: selector "${post.name}" cannot run post-QKᵀ (it supports ${post.timings.join(", ")})`);
  if (!pre.timings.includes("pre")) throw new HybridgenError(`pairSelectors: selector "${pre.name}" cannot run pre-QKᵀ (it supports ${pre.timings.join(", ")})`);
  return Object.freeze({
    name: `${post.name}+${pre.name}`,
    timings: Object.freeze(["pre", "post"] as const),
    needsScores: post.needsScores || pre.needsScores,
    needsKeys: (post.needsKeys ?? false) || (pre.needsKeys ?? false),
    // The engine passes K to whichever half runs; only "all"+"all" ignores it entirely.
    usesBudget: post.usesBudget || pre.usesBudget,
    // The engine runs a top-K kernel only under post, where the post half chooses ("all" would apply to pre too).
    ...(post.kernel === "topk" || post.kernel === "topk-shared" ? { kernel: post.kernel } : {}),
    initState: (info: SelectorLayerInfo): PairState => ({ post: post.initState(info), pre: pre.initState(info) }),
    select(input: SelectionInput<PairState>): Selection {
      if (input.timing === "post") return post.select({ ...input, state: input.state.post });
      return pre.select({ ...input, state: input.state.pre });
    },
  });
}
