/**
 * The mark the package's own selectors pass to defineSelector: their select() reads the engine's
 * buffers in place (no defensive copy). Not exported from the package, so a plugin cannot claim it.
 */
export const BUILTIN: unique symbol = Symbol("hybridgen built-in selector");
export type BuiltinMark = typeof BUILTIN;
