/** Text ↔ token ids. Implementations: HfTokenizer (tokenizer.json through @huggingface/tokenizers),
 * BpeTokenizer (SentencePiece-style BPE, Llama-2 / llama2.c) and ByteTokenizer (dummy-weight presets). */
export interface Tokenizer {
  readonly vocabSize: number;
  readonly bosId: number | null;
  readonly eosId: number | null;
  /** Ids of `text`; a BOS id is prepended when `addBos` (default true) and the model has one. */
  encode(text: string, options?: { addBos?: boolean }): number[];
  /** The text of one token as it appears after `prev` (SentencePiece drops the leading
   * space of the first piece after BOS). Byte-fallback pieces decode to raw bytes, so
   * callers streaming text should use a `TextDecoder` in stream mode on `decodeBytes`. */
  decodeBytes(id: number, prev?: number): Uint8Array;
  /** Whole-sequence decode. */
  decode(ids: readonly number[]): string;
}
