/**
 * The disk tier's files: named after the process, removed when their store is released, on
 * process exit, on SIGINT/SIGTERM (the mapping stays valid after the unlink, so a run that
 * handles Ctrl-C itself still finishes its step), and, for files a killed process left behind,
 * the next time a store uses the directory.
 */
import { readdirSync, unlinkSync } from "node:fs";
import { join } from "node:path";

const PREFIX = "hybridgen-kv-";
const live = new Set<string>();
let hooked = false;
let serial = 0;

/** A fresh file name in `dir` for one segment: hybridgen-kv-<pid>-<serial>-<what>.bin. */
export function diskFileName(dir: string, what: string): string {
  return join(dir, `${PREFIX}${process.pid}-${serial++}-${what}.bin`);
}

function removeQuietly(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    /* already gone */
  }
}

/** Removes every disk-tier file of this process (the exit and signal paths). */
export function removeAllDiskFiles(): void {
  for (const f of live) removeQuietly(f);
  live.clear();
}

function onSignal(signal: NodeJS.Signals): void {
  removeAllDiskFiles();
  // With no other listener the signal must still end the process, as it would have without us.
  if (process.listenerCount(signal) === 1) {
    process.removeListener(signal, onSignal);
    process.kill(process.pid, signal);
  }
}

function hook(): void {
  if (hooked) return;
  hooked = true;
  process.on("exit", removeAllDiskFiles);
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
}

export function trackDiskFile(path: string): void {
  hook();
  live.add(path);
}

export function removeDiskFile(path: string): void {
  live.delete(path);
  removeQuietly(path);
}

/** Disk-tier files currently held by this process. */
export function liveDiskFiles(): string[] {
  return [...live];
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Removes files of `dir` that a process no longer running left behind; returns their names. */
export function sweepStaleDiskFiles(dir: string): string[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const n of names) {
    const m = /^hybridgen-kv-(\d+)-\d+-[\w.]+\.bin$/.exec(n);
    if (!m || Number(m[1]) === process.pid || alive(Number(m[1]))) continue;
    removeQuietly(join(dir, n));
    removed.push(n);
  }
  return removed;
}
