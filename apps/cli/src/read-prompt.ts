import { readFileSync } from "node:fs";
import { HybridgenError } from "@hybridgen/core";
import type { CliIo } from "./io.js";

/** Strict UTF-8: a prompt that is not valid text is an error, not silent U+FFFD. */
function decodeUtf8(bytes: Uint8Array, source: string): string {
  try {
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: false }).decode(bytes);
  } catch {
    const bad = firstInvalidUtf8Offset(bytes);
    throw new HybridgenError(`${source} is not valid UTF-8 text (bad byte at offset ${bad})`, "EPROMPT");
  }
}

/** Offset of the first byte that starts an invalid UTF-8 sequence (for the error message). */
export function firstInvalidUtf8Offset(bytes: Uint8Array): number {
  let i = 0;
  while (i < bytes.length) {
    const b = bytes[i]!;
    // Sequence length and the allowed range of the second byte (rejects overlongs,
    // surrogates and code points above U+10FFFF, as the WHATWG decoder does).
    let len = 0, lo = 0x80, hi = 0xbf;
    if (b < 0x80) len = 1;
    else if (b >= 0xc2 && b <= 0xdf) len = 2;
    else if (b >= 0xe0 && b <= 0xef) { len = 3; if (b === 0xe0) lo = 0xa0; if (b === 0xed) hi = 0x9f; }
    else if (b >= 0xf0 && b <= 0xf4) { len = 4; if (b === 0xf0) lo = 0x90; if (b === 0xf4) hi = 0x8f; }
    else return i;
    if (i + len > bytes.length) return i;
    for (let j = 1; j < len; j++) {
      const c = bytes[i + j]!;
      if (j === 1 ? c < lo || c > hi : c < 0x80 || c > 0xbf) return i;
    }
    i += len;
  }
  return -1;
}

/** A UTF-8 text file; `what` names it in errors ("prompt file", "prompts file"). */
export function readTextFile(path: string, what: string): string {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(path);
  } catch (e) {
    const code = (e as { code?: string }).code;
    const why = code === "ENOENT" ? "no such file" : code === "EISDIR" ? "it is a directory" : (code ?? String(e));
    throw new HybridgenError(`cannot read ${what} ${path}: ${why}`, "EPROMPT");
  }
  return decodeUtf8(bytes, `${what} ${path}`);
}

/** The prompt text: --prompt, else --prompt-file, else all of stdin; one that holds no text (empty or only white space) is an error. */
export async function readPrompt(opts: { prompt?: string; promptFile?: string }, io: CliIo): Promise<string> {
  const [text, source] =
    opts.prompt !== undefined ? [opts.prompt, "--prompt"]
    : opts.promptFile !== undefined ? [readTextFile(opts.promptFile, "prompt file"), `prompt file ${opts.promptFile}`]
    : [decodeUtf8(await io.readStdin(), "the prompt on stdin"), "the prompt on stdin"];
  if (text.trim() === "") throw new HybridgenError(`the prompt is empty (${source} holds no text)`, "EPROMPT");
  return text;
}
