/**
 * `@hybridgen/core/testing`: the helpers the engine's own tests use — a seeded PRNG and random
 * arrays, a tiny in-memory Llama with its tokenizer, the window-partial cases every backend's
 * attnPartial/attnMerge is checked on, and a loopback host link on two reference backends — so a backend package's tests build the same models and
 * cases without reaching into core's test folder (the runtime's hybrid-step tests use the link).
 */
export * from "./engine-helpers.js";
export * from "./attn-partial-case.js";
export * from "./loopback-link.js";
