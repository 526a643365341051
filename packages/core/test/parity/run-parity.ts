/** The parity runner (src/parity) with the committed transformers references of fixtures/parity. */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parseParityRefs, type CaseRef } from "../../src/parity/run-parity.js";

export { relError, runParityCase, type CaseRef, type ParityResult } from "../../src/parity/run-parity.js";

export function loadRefs(): Map<string, CaseRef> {
  return parseParityRefs(readFileSync(fileURLToPath(new URL("../fixtures/parity/refs.json", import.meta.url)), "utf8"));
}
