/**
 * What a first run shows: `help X` is `X --help`, --selector's help names every built-in, a
 * machine without a GPU says so in plain words (the CUDA detail only with --verbose), thread
 * counts are grammatical, a prompt argument that is not UTF-8 is refused, Ctrl-C during a model
 * load ends the process then, and info and inspect report the same host memory.
 */
import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { builtinSelectors } from "@hybridgen/selectors";
import { beforeAll, describe, expect, it } from "vitest";
import { bufferedIo } from "../src/io.js";
import { runCli } from "../src/run-cli.js";
import { BIN, requireBuiltBin, runBin } from "./helpers.js";
import { PROMPT, stories15M } from "./model-fixture.js";

let model = "";
beforeAll(async () => {
  requireBuiltBin();
  model = await stories15M();
});

async function cli(args: string[]): Promise<{ code: number; out: string; err: string }> {
  const io = bufferedIo();
  const code = await runCli(args, io);
  return { code, out: io.out, err: io.err };
}

const gpuPresent = existsSync("/dev/nvidiactl") || existsSync("/dev/nvidia0");

describe("a newcomer's first runs", () => {
  it("`hybridgen help X` prints exactly `hybridgen X --help`", async () => {
    for (const command of ["generate", "inspect", "plan", "profile-kmin", "bench", "eval", "info", "fetch"]) {
      const viaHelp = await cli(["help", command]);
      const viaFlag = await cli([command, "--help"]);
      expect(viaHelp.code, command).toBe(0);
      expect(viaHelp.out, command).toBe(viaFlag.out);
    }
    expect((await cli(["help", "generate"])).out).toContain("--gpu-kv-budget");
    expect((await cli(["help"])).out).toBe((await cli(["--help"])).out);
  });

  it("--selector's help names every built-in selector", async () => {
    const help = (await cli(["generate", "--help"])).out;
    const selectorHelp = help.slice(help.indexOf("--selector "), help.indexOf("--selector-options"));
    for (const name of Object.keys(builtinSelectors)) expect(selectorHelp, name).toMatch(new RegExp(`\\b${name}\\b`));
  });

  it.skipIf(gpuPresent)("without a GPU: 'no GPU found: running on the CPU', the CUDA detail only with --verbose; '1 thread'", () => {
    const args = ["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "2", "--threads", "1"];
    const plain = runBin(args);
    expect(plain.code, plain.stderr).toBe(0);
    const loaded = plain.stderr.split("\n").find((l) => l.startsWith("loaded "))!;
    expect(loaded).toMatch(/ with 1 thread \(no GPU found: running on the CPU\) in \d+ ms$/);
    expect(plain.stderr).not.toMatch(/CUDA|driver/);
    const verbose = runBin([...args, "--verbose"]);
    expect(verbose.code, verbose.stderr).toBe(0);
    expect(verbose.stderr).toMatch(/\(no GPU found: running on the CPU: CUDA unavailable: [^\n]+\) in \d+ ms\n/);
    expect(verbose.stdout).toBe(plain.stdout);
  });

  it("a --prompt whose bytes are not UTF-8 is refused in one line, as stdin and --prompt-file are", () => {
    const run = (prompt: string) => spawnSync("sh", ["-c", `"$0" generate --model "$1" --max-tokens 1 ${prompt}`, BIN, model], { encoding: "utf8" });
    const bad = run(`--prompt "$(printf 'ab\\377c')"`);
    expect(bad.status).toBe(2);
    expect(bad.stderr).toBe("error: the value of --prompt is not valid UTF-8 text (bad byte at offset 2)\n");
    const inline = run(`"--prompt=$(printf '\\300\\200')" `);
    expect(inline.status).toBe(2);
    expect(inline.stderr).toBe("error: --prompt is not valid UTF-8 text (bad byte at offset 9)\n");
    const good = run(`--prompt "$(printf 'caf\\303\\251')" --temperature 0`);
    expect(good.status, good.stderr).toBe(0);
    expect(good.stdout.startsWith("café")).toBe(true);
  });

  it("Ctrl-C during a model load ends the process then, not after the load", async () => {
    // 3.2 B parameters of dummy weights generated on one thread: seconds of synchronous loading,
    // during which a JavaScript signal handler could not run.
    const child = spawn(BIN, ["generate", "--model", "preset:llama-3.2-3b", "--dummy-weights", "--prompt", "x", "--max-tokens", "1", "--threads", "1"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr!.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on("close", (code, signal) => resolve({ code, signal })));
    await new Promise((r) => setTimeout(r, 1000));
    child.kill("SIGINT");
    const { code, signal } = await exited;
    // Ended by the signal during the load (or, on a slow start, by the handler before it began),
    // never after the load finished, which prints "loaded …".
    expect(signal === "SIGINT" || code === 130, `exit code ${code}, signal ${signal}; ${stderr}`).toBe(true);
    expect(stderr).not.toContain("loaded ");
  });

  it("info and inspect report the same host memory (the memory tiers)", async () => {
    const info = JSON.parse((await cli(["info", "--json"])).out) as { tiers: { kind: string; capacityBytes?: number }[] };
    const bytes = info.tiers.filter((t) => t.kind !== "file").reduce((s, t) => s + (t.capacityBytes ?? 0), 0);
    const inspect = await cli(["inspect", model]);
    expect(inspect.code, inspect.err).toBe(0);
    expect(inspect.out).toContain(`(host memory here: ${(bytes / 2 ** 30).toFixed(1)} GiB in the memory tiers of hybridgen info)`);
  });
});
