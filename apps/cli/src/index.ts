/** Programmatic entry of the hybridgen CLI (the bin is src/hybridgen.ts). */
export { runCli, VERSION, EXIT_USAGE, EXIT_INTERNAL } from "./run-cli.js";
export { EXIT_INTERRUPTED, runGenerate } from "./commands/generate.js";
export { GenerateCliOptionsSchema, type GenerateCliOptions, type GenerateCliInput } from "./generate-options.js";
export { parseGenerateArgs } from "./parse-generate-args.js";
export { bufferedIo, type CliIo } from "./io.js";
