/**
 * The paper's arrangement (§4.5): a score-based selector while the scheduler picks post-QKᵀ,
 * a cheap predictor when it switches to pre-QKᵀ. pairSelectors() makes one TokenSelector of
 * the two that dispatches on the timing of each call, each half keeping its own state.
 */
import { HybridgenError, SPEC_VERSION, kernelTiming, stageKernel, type Selection, type SelectorKernel, type SelectionInput, type SelectorLayerInfo, type TokenSelector } from "@hybridgen/spec";

export interface PairState {
  readonly post: unknown;
  readonly pre: unknown;
}

export function pairSelectors(parts: { post: TokenSelector<any>; pre: TokenSelector<any> }): TokenSelector<PairState> {
  const { post, pre } = parts;
  if (!post.timings.includes("post")) throw new HybridgenError(`pairSelectors: selector "${post.name}" cannot run post-QKᵀ (it supports ${post.timings.join(", ")})`);
  if (!pre.timings.includes("pre")) throw new HybridgenError(`pairSelectors: selector "${pre.name}" cannot run pre-QKᵀ (it supports ${pre.timings.join(", ")})`);
  return Object.freeze({
    spec: SPEC_VERSION,
    name: `${post.name}+${pre.name}`,
    timings: Object.freeze(["pre", "post"] as const),
    needsScores: post.needsScores || pre.needsScores,
    needsKeys: (post.needsKeys ?? false) || (pre.needsKeys ?? false),
    // The engine passes K to whichever half runs; only "all"+"all" ignores it entirely.
    usesBudget: post.usesBudget || pre.usesBudget,
    // Each half's kernel of its own timing ("all" would apply to the other half's timing too).
    ...pairKernel(stageKernel(post, "post"), stageKernel(pre, "pre")),
    initState: (info: SelectorLayerInfo): PairState => ({ post: post.initState(info), pre: pre.initState(info) }),
    select(input: SelectionInput<PairState>): Selection {
      if (input.timing === "post") return post.select({ ...input, state: input.state.post });
      return pre.select({ ...input, state: input.state.pre });
    },
  });
}

/** The pair's kernels: one per half that has a kernel of its own timing, a list when both do. */
function pairKernel(post: SelectorKernel | undefined, pre: SelectorKernel | undefined): { kernel?: SelectorKernel | readonly SelectorKernel[] } {
  const list = [post, pre].filter((k): k is SelectorKernel => k !== undefined && kernelTiming(k) !== null);
  return list.length === 0 ? {} : { kernel: list.length === 1 ? list[0]! : Object.freeze(list) };
}
