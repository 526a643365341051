import { spawn, type ChildProcess } from "node:child_process";
import { BIN } from "./helpers.js";

export interface RunningServer {
  readonly url: string;
  readonly child: ChildProcess;
  /** stderr so far. */
  stderr(): string;
  /** Sends `signal` and resolves with the exit code and signal. */
  stop(signal?: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** Starts `hybridgen serve --port 0 …` and resolves once it says ready (its URL from the stderr line). */
export function startServer(args: string[], env: Record<string, string> = {}): Promise<RunningServer> {
  const e: Record<string, string | undefined> = { ...process.env, ...env };
  delete e.HYBRIDGEN_DEBUG;
  const child = spawn(BIN, ["serve", "--port", "0", ...args], { env: e, stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`the server did not start in 60 s:\n${err}`));
    }, 60_000);
    child.stderr!.setEncoding("utf8").on("data", (d: string) => {
      err += d;
      const m = /^ready: .* at (http:\/\/\S+)$/m.exec(err);
      if (m) {
        clearTimeout(timer);
        resolve({
          url: m[1]!, child, stderr: () => err,
          stop: (signal = "SIGTERM") => {
            if (child.exitCode === null && child.signalCode === null) child.kill(signal);
            return exited;
          },
        });
      }
    });
    exited.then(({ code }) => {
      clearTimeout(timer);
      reject(new Error(`the server exited (${code}) before it was ready:\n${err}`));
    });
  });
}

/** One metric's value from the Prometheus text (labels as written, e.g. `{reason="cancelled"}`). */
export async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  if (!line) throw new Error(`no metric ${name} in:\n${text}`);
  return Number(line.slice(name.length + 1));
}

/** Polls `check` every 20 ms until it holds (bounded: 200 tries). */
export async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** The data lines of an SSE body, parsed (the closing "[DONE]" kept as the string). */
export function sseEvents(body: string): (Record<string, unknown> | "[DONE]")[] {
  return body.split("\n\n").filter((b) => b.trim() !== "").map((b) => {
    if (!b.startsWith("data: ")) throw new Error(`not an SSE data line: ${JSON.stringify(b)}`);
    const data = b.slice(6);
    return data === "[DONE]" ? "[DONE]" : (JSON.parse(data) as Record<string, unknown>);
  });
}
