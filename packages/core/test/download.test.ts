/** downloadFile against a local HTTP server: the bytes, a progress line per tenth, and one-line errors. */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { downloadFile } from "../src/download.js";
import { HybridgenError } from "@hybridgen/spec";

const body = new Uint8Array(3 * 1024 * 1024 + 17).map((_, i) => (i * 31 + 7) & 0xff);
let server: ReturnType<typeof Bun.serve>;
let base: string;
const dir = mkdtempSync(join(tmpdir(), "hybridgen-download-"));

beforeAll(() => {
  server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch(req) {
      const path = new URL(req.url).pathname;
      if (path === "/file") return new Response(body, { headers: { "content-length": String(body.length) } });
      if (path === "/short") return new Response(body.subarray(0, 100), { headers: { "content-length": "100" } });
      return new Response("missing", { status: 404 });
    },
  });
  base = `http://127.0.0.1:${server.port}`;
});

afterAll(() => {
  server.stop(true);
  rmSync(dir, { recursive: true, force: true });
});

describe("downloadFile", () => {
  it("writes every byte and reports each tenth of the way", async () => {
    const lines: string[] = [];
    const n = await downloadFile(`${base}/file`, join(dir, "a"), "test-file", (m) => lines.push(m));
    expect(n).toBe(body.length);
    expect(Buffer.compare(readFileSync(join(dir, "a")), Buffer.from(body))).toBe(0);
    expect(lines.length).toBeGreaterThanOrEqual(5); // a chunk may cross more than one tenth
    expect(lines.length).toBeLessThanOrEqual(10);
    expect(lines.at(-1)).toBe("downloading test-file: 3.0 / 3.0 MB (100%)");
    const percents = lines.map((l) => Number(/\((\d+)%\)$/.exec(l)![1]));
    expect(percents).toEqual([...percents].sort((a, b) => a - b));
  });

  it("an HTTP error or an unreachable server is one HybridgenError line", async () => {
    await expect(downloadFile(`${base}/nothing`, join(dir, "b"), "x", () => {})).rejects.toThrow(new HybridgenError("cannot download x: HTTP 404"));
    const closed = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("") });
    const url = `http://127.0.0.1:${closed.port}/`;
    closed.stop(true);
    const e = await downloadFile(url, join(dir, "c"), "y", () => {}).catch((err) => err);
    expect(e).toBeInstanceOf(HybridgenError);
    expect(e.message).toMatch(/^cannot download y: /);
    expect(e.message).not.toContain("\n");
  });
});
