/**
 * hybrid-modes --synthetic-kv on the CPU backend (the tiny preset): every cache at the context without a
 * prefill — full attention's and the hybrid one's, whose store the evictions filled — and the run says so.
 */
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const script = fileURLToPath(new URL("../src/hybrid-modes.ts", import.meta.url));

describe("hybrid-modes --synthetic-kv", () => {
  it("decodes full attention and a hybrid config from filled caches: the store holds every token past the window", () => {
    const r = spawnSync(process.execPath, [script, "--backend", "cpu", "--preset", "tiny", "--contexts", "4096", "--window", "512", "--k", "32", "--steps", "6",
      "--configs", "full,pre-index-host", "--synthetic-kv", "--threads", "1"], { encoding: "utf8", timeout: 120_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^context 4096: synthetic KV in [\d.]+ s; 3584 tokens offloaded, window 512 with 4 sinks$/m);
    expect(r.stdout).toMatch(/^## tiny, .+; synthetic KV \(--synthetic-kv\); cpu$/m);
    const rows = r.stdout.split("\n").filter((l) => /^\| 4096 \| (full attention on the device|pre-index-host) \| [\d.]+ \|/.test(l));
    expect(rows.length).toBe(4); // each row as it runs, then the table
    // The hybrid steps selected from the filled store: K 32 a KV head at every step.
    expect(r.stdout).toMatch(/^\| 4096 \| pre-index-host \| .+ \| 32 \/ pre \|/m);
  });
});
