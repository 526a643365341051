/** Streams a URL into a file, reporting progress as it goes (the first-use model download is 112 MB). */
import { closeSync, openSync, writeSync } from "node:fs";
import { HybridgenError } from "@hybridgen/spec";

const MB = 1024 * 1024;
const mb = (n: number) => (n / MB).toFixed(1);

/**
 * Writes the body of `url` to `path`. `progress` gets a line at every tenth of the size when the
 * server gives one (else every 16 MB): "downloading NAME: 44.8 / 112.0 MB (40%)".
 */
export async function downloadFile(url: string, path: string, label: string, progress: (message: string) => void): Promise<number> {
  let response: Response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new HybridgenError(`cannot download ${label}: ${(e as Error).message}`);
  }
  if (!response.ok || !response.body) throw new HybridgenError(`cannot download ${label}: HTTP ${response.status}`);
  const total = Number(response.headers.get("content-length")) || 0;
  let got = 0;
  let reported = 0; // tenths (or 16 MB steps without a size) already reported
  const fd = openSync(path, "w");
  try {
    for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
      writeSync(fd, chunk);
      got += chunk.length;
      const reached = total > 0 ? Math.floor((10 * got) / total) : Math.floor(got / (16 * MB));
      if (reached > reported) {
        reported = reached;
        progress(total > 0 ? `downloading ${label}: ${mb(got)} / ${mb(total)} MB (${Math.floor((100 * got) / total)}%)` : `downloading ${label}: ${mb(got)} MB`);
      }
    }
  } finally {
    closeSync(fd);
  }
  if (total > 0 && got !== total) throw new HybridgenError(`cannot download ${label}: got ${got} of ${total} bytes`);
  return got;
}
