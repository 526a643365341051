import { HybridgenError, type TokenSelector } from "@hybridgen/core";
import type { SelectorFactory } from "./define-selector.js";
import { allTokens } from "./builtins/all-tokens.js";
import { exactTopK } from "./builtins/exact-topk.js";
import { h2o } from "./builtins/h2o.js";
import { infinigen } from "./builtins/infinigen.js";
import { keyformer } from "./builtins/keyformer.js";
import { quest } from "./builtins/quest.js";
import { streamingLLM } from "./builtins/streaming.js";

/** The built-in selectors by the name users type. */
export const builtinSelectors: Readonly<Record<string, SelectorFactory<any, any>>> = Object.freeze({
  [exactTopK.selectorName]: exactTopK,
  [streamingLLM.selectorName]: streamingLLM,
  [allTokens.selectorName]: allTokens,
  [h2o.selectorName]: h2o,
  [quest.selectorName]: quest,
  [infinigen.selectorName]: infinigen,
  [keyformer.selectorName]: keyformer,
});

/** A built-in selector by name (`--selector topk`), with its options validated. */
export function createSelector(name: string, options?: unknown): TokenSelector<any> {
  const factory = builtinSelectors[name];
  if (!factory) {
    throw new HybridgenError(`unknown selector "${name}" (built-ins: ${Object.keys(builtinSelectors).join(", ")})`);
  }
  return factory(options);
}
