/**
 * The server's SSE read back: the data of each event of a stream as it arrives ("[DONE]" included).
 * One reader for every client of `hybridgen serve`: the page at / (its source is inlined there, so it
 * uses nothing outside itself and no TypeScript-only syntax survives transpiling), the serve bench.
 */
export async function* sseData(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const reader = body.getReader(), dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      yield event.replace(/^data: /, "");
    }
  }
}
