/**
 * The command line as the kernel passed it: argv reaches JavaScript already decoded, with any
 * invalid UTF-8 silently turned into U+FFFD, so a prompt given with --prompt is checked against
 * its raw bytes (/proc/self/cmdline on Linux) and refused as stdin and --prompt-file are.
 */
import { readFileSync } from "node:fs";
import { HybridgenError } from "@hybridgen/core";
import { firstInvalidUtf8Offset } from "./read-prompt.js";

/** The last `count` arguments of this process, as bytes; null where /proc is not available. */
export function rawProcessArgs(count: number): Uint8Array[] | null {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync("/proc/self/cmdline");
  } catch {
    return null;
  }
  const args: Uint8Array[] = [];
  let start = 0;
  for (let i = 0; i < bytes.length; i++) {
    if (bytes[i] === 0) {
      args.push(bytes.subarray(start, i));
      start = i + 1;
    }
  }
  if (start < bytes.length) args.push(bytes.subarray(start));
  return args.length >= count ? args.slice(args.length - count) : null;
}

/** Throws a one-line error naming the first argument whose bytes are not UTF-8 (by its flag when it is a flag's value). */
export function checkArgsUtf8(argv: readonly string[], raw: readonly Uint8Array[]): void {
  if (raw.length !== argv.length) return; // not this command line's bytes: nothing to compare
  for (let i = 0; i < raw.length; i++) {
    const bad = firstInvalidUtf8Offset(raw[i]!);
    if (bad < 0) continue;
    const arg = argv[i]!;
    const prev = argv[i - 1];
    const name = arg.startsWith("-")
      ? arg.split("=")[0]!
      : prev !== undefined && prev.startsWith("-") && !prev.includes("=")
        ? `the value of ${prev}`
        : `argument ${i + 1}`;
    throw new HybridgenError(`${name} is not valid UTF-8 text (bad byte at offset ${bad})`, "EPROMPT");
  }
}
