/**
 * Headless Chromium driven through the DevTools protocol (a WebSocket, JSON messages): enough
 * to open a page, run script in it and read values back. No package: Bun has WebSocket.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The distribution's chromium binary, or null when it is not installed. */
export function findChromium(): string | null {
  for (const name of ["chromium", "chromium-browser"]) {
    const r = spawnSync("sh", ["-c", `command -v ${name}`], { encoding: "utf8" });
    if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  }
  return null;
}

export interface Browser {
  /** Evaluates `expression` in the page (awaiting a promise) and returns its value. */
  evaluate<T>(expression: string): Promise<T>;
  navigate(url: string): Promise<void>;
  close(): Promise<void>;
}

export async function launch(binary: string): Promise<Browser> {
  const profile = mkdtempSync(join(tmpdir(), "hg-chromium-"));
  const child: ChildProcess = spawn(binary, [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--remote-debugging-port=0", `--user-data-dir=${profile}`, "about:blank",
  ], { stdio: ["ignore", "ignore", "pipe"] });
  const cleanup = () => rmSync(profile, { recursive: true, force: true });
  const port = await new Promise<number>((resolve, reject) => {
    let err = "";
    const timer = setTimeout(() => reject(new Error(`chromium did not start in 30 s:\n${err}`)), 30_000);
    child.stderr!.setEncoding("utf8").on("data", (d: string) => {
      err += d;
      const m = /DevTools listening on ws:\/\/[^:]+:(\d+)\//.exec(err);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    child.on("exit", (code) => reject(new Error(`chromium exited (${code}):\n${err}`)));
  });
  const targets = (await (await fetch(`http://127.0.0.1:${port}/json/list`)).json()) as { type: string; webSocketDebuggerUrl: string }[];
  const page = targets.find((t) => t.type === "page")!;
  const ws = new WebSocket(page.webSocketDebuggerUrl);
  await new Promise((resolve, reject) => {
    ws.onopen = resolve;
    ws.onerror = reject;
  });
  let id = 0;
  const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  const events: ((method: string) => void)[] = [];
  ws.onmessage = (m) => {
    const msg = JSON.parse(String(m.data)) as { id?: number; result?: unknown; error?: { message: string }; method?: string };
    if (msg.id !== undefined) {
      const p = pending.get(msg.id)!;
      pending.delete(msg.id);
      if (msg.error) p.reject(new Error(msg.error.message));
      else p.resolve(msg.result);
    } else if (msg.method) for (const f of events) f(msg.method);
  };
  const send = (method: string, params: object = {}) =>
    new Promise<unknown>((resolve, reject) => {
      pending.set(++id, { resolve, reject });
      ws.send(JSON.stringify({ id, method, params }));
    });
  await send("Page.enable");
  return {
    async evaluate<T>(expression: string): Promise<T> {
      const r = (await send("Runtime.evaluate", { expression, awaitPromise: true, returnByValue: true })) as { result: { value: T }; exceptionDetails?: { text: string; exception?: { description?: string } } };
      if (r.exceptionDetails) throw new Error(`in the page: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
      return r.result.value;
    },
    async navigate(url: string) {
      const loaded = new Promise<void>((resolve) => events.push((m) => m === "Page.loadEventFired" && resolve()));
      await send("Page.navigate", { url });
      await loaded;
    },
    async close() {
      ws.close();
      child.kill("SIGTERM");
      await new Promise((resolve) => (child.exitCode !== null ? resolve(null) : child.on("exit", resolve)));
      cleanup();
    },
  };
}
