import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, it } from "vitest";
import { probeDiskGather } from "../src/index.js";

const dir = mkdtempSync(join(tmpdir(), "hg-gather-probe-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

it("probeDiskGather: a read's latency in the stage's cold gather, at threads × depth in flight (one a thread for page faults); no file left", async () => {
  const probes = await probeDiskGather(dir, { threads: 2, readDepths: [4, 0], rows: 512, fileBytes: 16 * 2 ** 20, rounds: 2 });
  expect(probes.map((p) => p.readDepth)).toEqual([8, 2]);
  for (const p of probes) {
    expect(p.rows).toBe(1024);
    // Random rows of 8 192 slots a KV head: adjacent ones share a read now and then, never more reads than rows.
    expect(p.reads).toBeGreaterThan(900);
    expect(p.reads).toBeLessThanOrEqual(1024);
    expect(p.latencyUs).toBeGreaterThan(0);
    expect(p.latencyUs).toBeLessThan(1e6);
  }
  expect(readdirSync(dir)).toEqual([]);
  await expect(probeDiskGather(dir, { threads: 0, readDepths: [8] })).rejects.toThrow(/^disk gather probe: threads must be a positive integer and readDepth a non-negative one, got 0 × 8$/);
  await expect(probeDiskGather(dir, { threads: 1, readDepths: [1], fileBytes: 2 ** 20 })).rejects.toThrow(/^disk gather probe: 1048576 bytes hold too few rows for 8192 distinct ones$/);
});
