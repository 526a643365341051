/**
 * A tokenizer without a vocabulary file: ids 0-255 are UTF-8 bytes, every other id decodes
 * to nothing. For dummy-weight presets, whose text is meaningless anyway; it lets
 * `generate --model preset:… --dummy-weights` run without any download.
 */
import type { Tokenizer } from "./tokenizer.js";

const utf8 = new TextEncoder();
const EMPTY = new Uint8Array(0);
const BYTES = Array.from({ length: 256 }, (_, b) => Uint8Array.of(b));

export class ByteTokenizer implements Tokenizer {
  constructor(
    readonly vocabSize: number,
    readonly bosId: number | null = null,
    readonly eosId: number | null = null,
  ) {}

  encode(text: string, options: { addBos?: boolean } = {}): number[] {
    const ids = Array.from(utf8.encode(text));
    if ((options.addBos ?? true) && this.bosId !== null) ids.unshift(this.bosId);
    return ids;
  }

  decodeBytes(id: number): Uint8Array {
    return id >= 0 && id < 256 ? BYTES[id] : EMPTY;
  }

  decode(ids: readonly number[]): string {
    return new TextDecoder().decode(Uint8Array.from(ids.filter((id) => id >= 0 && id < 256)));
  }
}
