// --kv-window/--kv-sinks (full attention's resident window) and --gpu-kv-budget/--sink-tokens
// (hybrid's) size the same thing: mixing them is refused before any model is opened.
import { describe, expect, it } from "vitest";
import { bufferedIo, runCli } from "../src/index.js";

describe("window flags", () => {
  it("--kv-window or --kv-sinks with --attention hybrid is a one-line usage error", async () => {
    for (const extra of [["--kv-window", "64"], ["--kv-window", "64", "--kv-sinks", "4"]]) {
      const io = bufferedIo();
      const code = await runCli(["generate", "-p", "x", "--attention", "hybrid", "--gpu-kv-budget", "16", ...extra], io);
      expect(code).toBe(2);
      expect(io.out).toBe("");
      expect(io.err).toBe("error: --kv-window/--kv-sinks set the window of full attention; with --attention hybrid use --gpu-kv-budget/--sink-tokens\n");
    }
  });
});
