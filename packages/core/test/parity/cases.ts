/** The parity cases live in src/parity (backends outside core run them too); tests import them here. */
export * from "../../src/parity/cases.js";
