import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface FakeNode {
  id: number;
  cpulist: string | null; // null: no cpulist file
  memTotalKb: number | null; // null: no meminfo file
  memFreeKb?: number;
  readBandwidthMBs?: number;
}

/** Writes a sysfs-shaped tree (only the files discovery reads, plus distractors) and returns its root. */
export function fakeSys(nodes: FakeNode[]): string {
  const root = mkdtempSync(join(tmpdir(), "hg-sys-"));
  const base = join(root, "devices", "system", "node");
  mkdirSync(base, { recursive: true });
  for (const f of ["online", "possible", "has_cpu", "has_memory"]) writeFileSync(join(base, f), "0-3\n");
  mkdirSync(join(base, "power"));
  for (const n of nodes) {
    const dir = join(base, `node${n.id}`);
    mkdirSync(dir);
    mkdirSync(join(dir, "memory0"));
    if (n.cpulist !== null) writeFileSync(join(dir, "cpulist"), n.cpulist);
    if (n.memTotalKb !== null) {
      const free = n.memFreeKb ?? Math.floor(n.memTotalKb / 2);
      writeFileSync(
        join(dir, "meminfo"),
        `Node ${n.id} MemTotal:       ${n.memTotalKb} kB\nNode ${n.id} MemFree:        ${free} kB\nNode ${n.id} MemUsed:        ${n.memTotalKb - free} kB\nNode ${n.id} HugePages_Total:     0\n`,
      );
    }
    if (n.readBandwidthMBs !== undefined) {
      mkdirSync(join(dir, "access0", "initiators"), { recursive: true });
      writeFileSync(join(dir, "access0", "initiators", "read_bandwidth"), `${n.readBandwidthMBs}\n`);
    }
  }
  return root;
}
