// The clients' SSE reader (the page's and the serve bench's): each event's data whole, however the
// stream's chunks cut the events and their UTF-8 bytes.
import { describe, expect, it } from "vitest";
import { sseData } from "../src/serve/sse-reader.js";
import { sse } from "../src/serve/openai-responses.js";

function streamOf(bytes: Uint8Array, cuts: readonly number[]): ReadableStream<Uint8Array> {
  const edges = [0, ...cuts, bytes.length];
  return new ReadableStream({
    start(c) {
      for (let i = 1; i < edges.length; i++) c.enqueue(bytes.subarray(edges[i - 1]!, edges[i]!));
      c.close();
    },
  });
}

describe("sseData", () => {
  const events = [{ choices: [{ text: "héllo — ☃", finish_reason: null }] }, { choices: [], usage: { completion_tokens: 2 } }];
  const bytes = new TextEncoder().encode(events.map((e) => sse(e)).join("") + sse("[DONE]"));
  const want = [...events.map((e) => JSON.stringify(e)), "[DONE]"];

  it("yields every event's data in order, from one chunk or from chunks cut anywhere (mid-event, mid-character)", async () => {
    const read = async (cuts: number[]) => {
      const out: string[] = [];
      for await (const d of sseData(streamOf(bytes, cuts))) out.push(d);
      return out;
    };
    expect(await read([])).toEqual(want);
    const snowman = bytes.indexOf(0xe2); // the first byte of a three-byte character
    expect(await read([3, snowman + 1, snowman + 2, bytes.indexOf(10) + 1])).toEqual(want);
    expect(await read(Array.from({ length: bytes.length - 1 }, (_, i) => i + 1))).toEqual(want);
  });
});
