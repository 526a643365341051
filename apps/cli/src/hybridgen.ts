#!/usr/bin/env bun
/**
 * The `hybridgen` executable: wires the real process (stdio, env, Ctrl-C) to runCli.
 */
import { runCli } from "./run-cli.js";
import { EXIT_INTERRUPTED } from "./commands/generate.js";
import { processIo } from "./process-io.js";

const controller = new AbortController();
let sigints = 0;
const onSigint = () => {
  sigints += 1;
  // First Ctrl-C: stop generating and report; a second one: leave at once.
  if (sigints === 1) controller.abort();
  else process.exit(EXIT_INTERRUPTED);
};
process.on("SIGINT", onSigint);
// A reader that goes away (`hybridgen generate ... | head`) is not an error worth a trace.
process.stdout.on("error", (e: NodeJS.ErrnoException) => {
  if (e.code === "EPIPE") process.exit(0);
  throw e;
});

const io = processIo(controller.signal);
const code = await runCli(process.argv.slice(2), io);
process.off("SIGINT", onSigint);
await io.flush();
process.exit(code);
