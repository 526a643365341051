/**
 * `@hybridgen/core/testing`: the helpers the engine's own tests use — a seeded PRNG and random
 * arrays, a tiny in-memory Llama with its tokenizer, and the window-partial cases every backend's
 * attnPartial/attnMerge is checked on — so a backend package's tests build the same models and
 * cases without reaching into core's test folder.
 */
export * from "./engine-helpers.js";
export * from "./attn-partial-case.js";
