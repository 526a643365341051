export {
  defineSelector, isSelectorFactory, SELECTOR_FACTORY, type SelectorDefinition, type SelectorFactory, type LooseSelection,
} from "./define-selector.js";
export { checkSelectionInput } from "./check-input.js";
export { exactTopK, ExactTopKOptionsSchema } from "./builtins/exact-topk.js";
export { streamingLLM, StreamingOptionsSchema } from "./builtins/streaming.js";
export { allTokens } from "./builtins/all-tokens.js";
export { h2o, H2OOptionsSchema } from "./builtins/h2o.js";
export { quest, QuestOptionsSchema, type QuestState } from "./builtins/quest.js";
export { pageIndexSelector, PageIndexOptionsSchema } from "./builtins/page-index.js";
export { infinigen, InfiniGenOptionsSchema, chooseChannels, type InfiniGenState } from "./builtins/infinigen.js";
export { keyformer, KeyformerOptionsSchema, keyformerTau, gumbelTable, gumbelIndex, GUMBEL_TABLE, type KeyformerOptions, type KeyformerState } from "./builtins/keyformer.js";
export {
  builtinSelectors, createSelector, registerSelector, unregisterSelector, lookupSelector, selectorNames, isBuiltinSelector, type RegisterOptions,
} from "./registry.js";
export { loadSelectorSpec, selectorFromSpec, isRegisteredSpec, specParts } from "./selector-spec.js";
export { splitModuleRef } from "./load-selector.js";
export { pairSelectors, type PairState } from "./pair-selectors.js";
