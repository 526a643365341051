/**
 * TokenText: one sequence's generated text, token by token. Bytes are decoded with a
 * streaming TextDecoder (a character split over byte tokens comes out whole), and text that
 * might begin a stop string is held back until it is known not to; the stop string itself
 * is never released. generate() and generateBatch() share it.
 */
import type { Tokenizer } from "./tokenizer.js";

export class TokenText {
  /** Everything released so far. */
  text = "";
  private pending = ""; // decoded, not yet released (could begin a stop string)
  private readonly decoder = new TextDecoder("utf-8");

  constructor(
    private readonly tokenizer: Tokenizer,
    private readonly stop: readonly string[],
    /** The token before the first generated one (the prompt's last). */
    private prev: number,
  ) {}

  /**
   * Adds token `id`; returns the text it releases and whether a stop string ended the text.
   * `last`: no token follows (release everything held back).
   */
  push(id: number, last: boolean): { release: string; stopped: boolean } {
    this.pending += this.decoder.decode(this.tokenizer.decodeBytes(id, this.prev), { stream: true });
    this.prev = id;
    let release: string;
    let stopped = false;
    const hit = firstStop(this.pending, this.stop);
    if (hit >= 0) {
      release = this.pending.slice(0, hit);
      this.pending = "";
      stopped = true;
    } else if (last) {
      release = this.pending + this.decoder.decode();
      this.pending = "";
    } else {
      const hold = heldBack(this.pending, this.stop);
      release = this.pending.slice(0, this.pending.length - hold);
      this.pending = this.pending.slice(this.pending.length - hold);
    }
    this.text += release;
    return { release, stopped };
  }

  /** Releases what is held back (at EOS or abort: no stop string can complete any more). */
  flush(): string {
    const rest = this.pending + this.decoder.decode();
    this.pending = "";
    this.text += rest;
    return rest;
  }
}

/** Index of the earliest stop-string occurrence in `s`, or -1. */
function firstStop(s: string, stops: readonly string[]): number {
  let best = -1;
  for (const st of stops) {
    const i = s.indexOf(st);
    if (i >= 0 && (best < 0 || i < best)) best = i;
  }
  return best;
}

/** Length of the longest suffix of `s` that is a proper prefix of some stop string. */
function heldBack(s: string, stops: readonly string[]): number {
  let hold = 0;
  for (const st of stops) {
    for (let len = Math.min(st.length - 1, s.length); len > hold; len--) {
      if (s.endsWith(st.slice(0, len))) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}
