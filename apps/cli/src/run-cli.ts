import { parseArgs } from "node:util";
import { HybridgenError } from "@hybridgen/core";
import pkg from "../package.json" with { type: "json" };
import { BENCH_HELP, runBench } from "./commands/bench.js";
import { EVAL_HELP, runEval } from "./commands/eval.js";
import { runFetch } from "./commands/fetch.js";
import { runInfo } from "./commands/info.js";
import { INSPECT_HELP, runInspect } from "./commands/inspect.js";
import { runGenerate } from "./commands/generate.js";
import { PROFILE_KMIN_HELP, runProfileKmin } from "./commands/profile-kmin.js";
import { GENERATE_HELP, MAIN_HELP } from "./help.js";
import type { CliIo } from "./io.js";
import { parseArgsError } from "./parse-args-error.js";
import { checkArgsUtf8 } from "./raw-args.js";
import { parseGenerateArgs } from "./parse-generate-args.js";
import { HYBRID_HELP, splitHybridArgs } from "./hybrid-options.js";
import { KV_TIER_HELP, splitKvTierArgs } from "./kv-tier-options.js";
import { PLAN_HELP, runPlan } from "./commands/plan.js";
import { runServe } from "./commands/serve.js";

export const VERSION: string = pkg.version;

/** Exit code for bad usage or input (a HybridgenError); 1 is kept for internal errors. */
export const EXIT_USAGE = 2;
export const EXIT_INTERNAL = 1;

/** One line, whatever the message holds (messages from deep code may span lines). */
const oneLine = (s: string) => s.replace(/\s*\n\s*/g, " ").trim();

/**
 * Runs the CLI with `argv` (without the runtime and script path) and returns the exit code.
 * Every failure becomes one `error: ...` line on stderr; a stack only with HYBRIDGEN_DEBUG=1.
 */
export async function runCli(argv: readonly string[], io: CliIo): Promise<number> {
  try {
    if (io.rawArgs) checkArgsUtf8(argv, io.rawArgs);
    return await dispatch(argv, io);
  } catch (e) {
    const debug = io.env.HYBRIDGEN_DEBUG === "1";
    if (e instanceof HybridgenError) {
      io.stderr(`error: ${oneLine(e.message)}\n`);
      if (debug && e.stack) io.stderr(`${e.stack}\n`);
      return EXIT_USAGE;
    }
    const message = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
    io.stderr(`error: internal error: ${oneLine(message)}${debug ? "" : " (set HYBRIDGEN_DEBUG=1 for details)"}\n`);
    if (debug && e instanceof Error && e.stack) io.stderr(`${e.stack}\n`);
    return EXIT_INTERNAL;
  }
}

async function dispatch(argv: readonly string[], io: CliIo): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command.startsWith("-")) {
    const values = parseStrict(
      argv,
      { help: { type: "boolean", short: "h" }, version: { type: "boolean", short: "v" } },
      "hybridgen",
    );
    if (values.version) {
      io.stdout(`hybridgen ${VERSION}\n`);
      return 0;
    }
    io.stdout(MAIN_HELP);
    return 0;
  }
  switch (command) {
    case "generate": {
      const { rest: tierArgs, tier, given } = splitKvTierArgs(rest);
      const { rest: generateArgs, hybrid } = splitHybridArgs(tierArgs);
      if (given && hybrid.attention !== "hybrid") throw new HybridgenError("--kv-placement, --kv-disk and --host-kv-budget place hybrid attention's offloaded store: add --attention hybrid", "EUSAGE");
      const opts = parseGenerateArgs(generateArgs);
      if (opts.help) {
        io.stdout(GENERATE_HELP + HYBRID_HELP + KV_TIER_HELP);
        return 0;
      }
      return runGenerate(opts, io, hybrid, tier);
    }
    case "fetch": {
      const values = parseStrict(rest, { help: { type: "boolean", short: "h" } }, "hybridgen fetch");
      if (values.help) {
        io.stdout(MAIN_HELP);
        return 0;
      }
      return runFetch(io);
    }
    case "plan":
      return runPlan(rest, io);
    case "inspect":
      return runInspect(rest, io);
    case "profile-kmin":
      return runProfileKmin(rest, io);
    case "bench":
      return runBench(rest, io);
    case "serve":
      return runServe(rest, io);
    case "eval":
      return runEval(rest, io);
    case "info": {
      const values = parseStrict(rest, { help: { type: "boolean", short: "h" }, json: { type: "boolean" } }, "hybridgen info");
      if (values.help) {
        io.stdout(MAIN_HELP);
        return 0;
      }
      return runInfo(io, values.json === true);
    }
    case "help":
      // `hybridgen help X` is `hybridgen X --help`, so the two never differ.
      return rest[0] === undefined || rest[0] === "help" ? (io.stdout(MAIN_HELP), 0) : dispatch([rest[0], "--help"], io);
    default:
      throw new HybridgenError(`unknown command ${JSON.stringify(command)} (commands: generate, serve, fetch, info, inspect, plan, profile-kmin, bench, eval, help; see hybridgen --help)`, "EUSAGE");
  }
}

type BoolFlags = Record<string, { type: "boolean"; short?: string }>;

function parseStrict(args: readonly string[], options: BoolFlags, command: string): Record<string, boolean | undefined> {
  try {
    return parseArgs({ args: [...args], strict: true, allowPositionals: false, options }).values as Record<string, boolean | undefined>;
  } catch (e) {
    throw parseArgsError(e, command);
  }
}
