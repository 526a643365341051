#!/usr/bin/env bun
/**
 * The `hybridgen` executable: wires the real process (stdio, env, Ctrl-C) to runCli.
 */
import { runCli } from "./run-cli.js";
import { EXIT_INTERRUPTED } from "./commands/generate.js";
import { processIo } from "./process-io.js";
import { rawProcessArgs } from "./raw-args.js";

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

const args = process.argv.slice(2);
const io = {
  ...processIo(controller.signal),
  rawArgs: rawProcessArgs(args.length) ?? undefined,
  // During a model load JavaScript does not run until the load returns: without our handler
  // the default action ends the process at the first Ctrl-C (the OS frees what it held).
  uninterruptible(on: boolean) {
    if (on) process.off("SIGINT", onSigint);
    else if (!process.listeners("SIGINT").includes(onSigint)) process.on("SIGINT", onSigint);
  },
};
const code = await runCli(args, io);
process.off("SIGINT", onSigint);
await io.flush();
process.exit(code);
