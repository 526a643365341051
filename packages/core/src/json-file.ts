import { readFileSync } from "node:fs";
import { fail } from "@hybridgen/spec";

/**
 * The parsed JSON of `path`, or a one-line error naming the file: unreadable (with the OS
 * code), not UTF-8, or not JSON (with the parser's first line; `what` says what the file should be).
 */
export function readJsonFile(path: string, what?: string): unknown {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(path);
  } catch (e) {
    fail(`${path}: cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    fail(`${path}: ${what ? `${what} is ` : ""}not valid UTF-8 text (JSON must be)`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    fail(`${path}: ${what ? `${what} is ` : ""}not valid JSON (${(e as Error).message.split("\n")[0]})`);
  }
}
