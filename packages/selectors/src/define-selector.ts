/**
 * defineSelector(): how a plugin author writes a TokenSelector. The definition is checked once
 * with zod; the returned factory validates options (an unknown key is an error naming it), and
 * every select() call is wrapped: a plugin gets a private copy of its input (input-copy.ts), and
 * one that throws, or returns non-integer, out-of-range, duplicate or too many ids, fails with an
 * error that names the plugin, the layer, the step and the value.
 */
import { z } from "zod";
import { HybridgenError, PAGE_INDEX_FORMS, SPEC_VERSION, SelectionTimingSchema, validateSelection, type Selection, type SelectionInput, type SelectionTiming, type SelectorKernel, type SelectorLayerInfo, type TokenSelector } from "@hybridgen/spec";
import { checkSelectionInput } from "./check-input.js";
import { BUILTIN, type BuiltinMark } from "./builtin-mark.js";
import { InputCopier } from "./input-copy.js";
import { unknownOptionKey } from "./option-keys.js";

/** Marks a factory made by defineSelector (Symbol.for: a plugin's own copy of this package marks it the same way). */
export const SELECTOR_FACTORY: unique symbol = Symbol.for("@hybridgen/selectors:factory") as never;

/** What a plugin's select() may return: the contract's Selection, or plain number arrays. */
export type LooseSelection =
  | Selection
  | { kind: "shared"; ids: Int32Array | number[] }
  | { kind: "perKvHead"; ids: (Int32Array | number[])[] };

export interface SelectorDefinition<O, S> {
  /** Lower-case kebab name, as users type it (`--selector my-plugin`). */
  name: string;
  description?: string;
  /** Timings the algorithm can run under: "pre" needs no logits, "post" reads them. */
  timings: SelectionTiming[];
  /** zod schema of the options; its output is what select() receives. */
  options?: z.ZodType<O>;
  /** Ask the engine for accumulated attention scores (H2O-style). */
  needsScores?: boolean | ((options: O) => boolean);
  /** False when the selector returns every token whatever K is. Default true. */
  usesBudget?: boolean;
  /** Ask the engine for the layer's offloaded K rows (`input.keys`). Default false. */
  needsKeys?: boolean;
  /** The selection equals this CpuStage kernel (the engine may run it natively instead of select()). */
  kernel?: SelectorKernel | ((options: O) => SelectorKernel | undefined);
  /** Per-(layer, sequence) state, created once when the sequence starts. */
  initState?: (info: SelectorLayerInfo, options: O) => S;
  select: (input: SelectionInput<S>, options: O) => LooseSelection;
}

/** Builds a selector from user options (validated by the definition's schema). */
export interface SelectorFactory<O, S> {
  (options?: unknown): TokenSelector<S>;
  readonly selectorName: string;
  readonly description: string;
  readonly timings: readonly SelectionTiming[];
  readonly optionsSchema: z.ZodType<O> | undefined;
  readonly [SELECTOR_FACTORY]: true;
}

/** Whether `v` is a factory made by defineSelector (this copy of the package or another). */
export function isSelectorFactory(v: unknown): v is SelectorFactory<unknown, unknown> {
  return typeof v === "function" && (v as unknown as Record<symbol, unknown>)[SELECTOR_FACTORY] === true;
}

const isFunction = (v: unknown) => typeof v === "function";

/** SelectorKernel: a top-K form, "all", Quest's pages with their size, StreamingLLM's sinks, or the page index (and where it is ranked). */
const KernelSchema = z.union([
  z.enum(["topk", "topk-shared", "all"]),
  z.object({ name: z.literal("quest"), pageSize: z.number().int().min(1).max(4096) }).strict(),
  z.object({ name: z.literal("streaming"), sinks: z.number().int().min(0).max(0x7fffffff) }).strict(),
  z.object({ name: z.literal("index"), form: z.enum(PAGE_INDEX_FORMS), pageSize: z.number().int().min(1).max(4096), superPages: z.number().int().min(1).max(4096), placement: z.enum(["auto", "host", "device"]).optional() }).strict(),
]);

const DefinitionSchema = z.object({
  name: z.string().regex(/^[a-z][a-z0-9-]*$/, "must be lower-case kebab-case (letters, digits, '-')"),
  description: z.string().optional(),
  timings: z.array(SelectionTimingSchema).min(1, "must list at least one of \"pre\", \"post\""),
  // Duck-typed, not instanceof: a plugin's schema may come from its own copy of zod.
  options: z.custom<z.ZodType>((v) => v === undefined || (typeof v === "object" && v !== null && typeof (v as z.ZodType).safeParse === "function"),
    "must be a zod schema (an object with safeParse)").optional(),
  needsScores: z.union([z.boolean(), z.custom<(o: unknown) => boolean>(isFunction)]).optional(),
  usesBudget: z.boolean().optional(),
  needsKeys: z.boolean().optional(),
  kernel: z.union([KernelSchema, z.custom<(o: unknown) => unknown>(isFunction)]).optional(),
  initState: z.custom<(...a: unknown[]) => unknown>(isFunction, "must be a function").optional(),
  select: z.custom<(...a: unknown[]) => unknown>(isFunction, "must be a function"),
});

function firstIssue(e: z.ZodError): string {
  const i = e.issues[0];
  return `${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`;
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

export function defineSelector<O = Record<string, never>, S = undefined>(definition: SelectorDefinition<O, S>, mark?: BuiltinMark): SelectorFactory<O, S> {
  const named = (definition as { name?: unknown })?.name;
  const parsed = DefinitionSchema.safeParse(definition);
  if (!parsed.success) {
    throw new HybridgenError(`defineSelector(${typeof named === "string" ? `"${named}"` : "?"}): ${firstIssue(parsed.error)}`);
  }
  const def = definition;
  const timings = Object.freeze([...new Set(def.timings)]);
  const who = `selector "${def.name}"`;

  const factory = (rawOptions?: unknown): TokenSelector<S> => {
    let options: O;
    if (def.options) {
      const unknown = unknownOptionKey(def.options, rawOptions);
      if (unknown) {
        throw new HybridgenError(`${who} options: unknown key ${JSON.stringify(unknown.key)} (it takes ${unknown.known.length ? unknown.known.join(", ") : "none"})`);
      }
      const r = def.options.safeParse(rawOptions ?? {});
      if (!r.success) throw new HybridgenError(`${who} options: ${firstIssue(r.error)}`);
      options = r.data;
    } else {
      if (rawOptions !== undefined && (typeof rawOptions !== "object" || rawOptions === null || Object.keys(rawOptions).length > 0)) {
        throw new HybridgenError(`${who} takes no options`);
      }
      options = {} as O;
    }
    const needsScores = typeof def.needsScores === "function" ? def.needsScores(options) : def.needsScores ?? false;
    const usesBudget = def.usesBudget ?? true;
    const kernel = typeof def.kernel === "function" ? def.kernel(options) : def.kernel;
    if (kernel !== undefined && !KernelSchema.safeParse(kernel).success) throw new HybridgenError(`${who}: kernel(options) gave ${JSON.stringify(kernel)}, not a selector kernel`);
    // A built-in reads the engine's buffers in place; a plugin reads its own copy.
    const copier = mark === BUILTIN ? undefined : new InputCopier();

    return Object.freeze({
      spec: SPEC_VERSION,
      name: def.name,
      timings,
      needsScores,
      usesBudget,
      needsKeys: def.needsKeys ?? false,
      ...(kernel === undefined ? {} : { kernel }),
      initState(info: SelectorLayerInfo): S {
        if (!def.initState) return undefined as S;
        try {
          return def.initState(info, options);
        } catch (e) {
          throw new HybridgenError(`${who} failed to create its state for layer ${info.layer}: ${message(e)}`);
        }
      },
      select(input: SelectionInput<S>): Selection {
        if (!timings.includes(input.timing)) {
          throw new HybridgenError(`${who} cannot run ${input.timing}-QKᵀ selection (it supports ${timings.join(", ")})`);
        }
        if (needsScores && !input.scores) throw new HybridgenError(`${who} needs accumulated scores, and the engine passed none`);
        if (def.needsKeys && !input.keys) throw new HybridgenError(`${who} needs the layer's offloaded keys, and the engine passed none (a CPU stage without offloadedKeys())`);
        checkSelectionInput(input, who);
        let raw: unknown;
        try {
          raw = def.select(copier ? copier.copy(input) : input, options);
        } catch (e) {
          throw new HybridgenError(`${who} failed at layer ${input.layer}, step ${input.step}: ${message(e)}`);
        }
        return validateSelection(raw, {
          offloaded: input.offloaded,
          kvHeads: input.layout.kvHeads,
          k: usesBudget ? input.k : undefined,
          source: `${who} at layer ${input.layer}, step ${input.step}`,
        });
      },
    });
  };

  return Object.assign(factory, {
    selectorName: def.name,
    description: def.description ?? "",
    timings,
    optionsSchema: def.options,
    [SELECTOR_FACTORY]: true as const,
  });
}
