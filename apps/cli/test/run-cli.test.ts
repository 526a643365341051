import { describe, expect, it } from "vitest";
import { bufferedIo, runCli, VERSION } from "../src/index.js";

describe("runCli in process", () => {
  it("--version and unknown commands", async () => {
    const ok = bufferedIo();
    expect(await runCli(["--version"], ok)).toBe(0);
    expect(ok.out).toBe(`hybridgen ${VERSION}\n`);

    const bad = bufferedIo();
    expect(await runCli(["bogus"], bad)).not.toBe(0);
    expect(bad.err).toBe('error: unknown command "bogus" (commands: generate, serve, fetch, info, inspect, plan, profile-kmin, bench, eval, help; see hybridgen --help)\n');
  });

  it("an unexpected error is one line, with the stack only under HYBRIDGEN_DEBUG=1", async () => {
    const failingStdin = (env: Record<string, string>) => {
      const io = bufferedIo({ env });
      io.readStdin = async () => {
        throw new TypeError("stdin exploded\nsecond line");
      };
      return io;
    };
    const quiet = failingStdin({});
    expect(await runCli(["generate"], quiet)).toBe(1);
    expect(quiet.err).toBe("error: internal error: TypeError: stdin exploded second line (set HYBRIDGEN_DEBUG=1 for details)\n");

    const debug = failingStdin({ HYBRIDGEN_DEBUG: "1" });
    expect(await runCli(["generate"], debug)).toBe(1);
    expect(debug.err.split("\n")[0]).toBe("error: internal error: TypeError: stdin exploded second line");
    expect(debug.err).toMatch(/\n\s+at /);
  });

  it("Ctrl-C while waiting for a prompt on stdin exits 130 at once", async () => {
    const controller = new AbortController();
    const io = bufferedIo({ signal: controller.signal });
    io.readStdin = () => new Promise<Uint8Array>(() => {}); // a terminal nobody types into
    setTimeout(() => controller.abort(), 20);
    expect(await runCli(["generate"], io)).toBe(130);
    expect(io.err).toBe("\ninterrupted\n");
    expect(io.out).toBe("");
  });
});
