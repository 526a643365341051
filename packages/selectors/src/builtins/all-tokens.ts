/** Every offloaded token, whatever K is: with exact logits, hybrid attention equals full attention. */
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";

export const allTokens = defineSelector({
  name: "all",
  description: "every offloaded token (K ignored): the exactness oracle",
  timings: ["pre", "post"],
  usesBudget: false,
  kernel: "all",
  select: ({ offloaded, primitives }) => ({ kind: "shared", ids: primitives.range(0, offloaded) }),
}, BUILTIN);
