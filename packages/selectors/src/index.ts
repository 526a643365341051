export { defineSelector, type SelectorDefinition, type SelectorFactory, type LooseSelection } from "./define-selector.js";
export { checkSelectionInput } from "./check-input.js";
export { exactTopK, ExactTopKOptionsSchema } from "./builtins/exact-topk.js";
export { streamingLLM, StreamingOptionsSchema } from "./builtins/streaming.js";
export { allTokens } from "./builtins/all-tokens.js";
export { h2o, H2OOptionsSchema } from "./builtins/h2o.js";
export { builtinSelectors, createSelector } from "./registry.js";
export { pairSelectors, type PairState } from "./pair-selectors.js";
