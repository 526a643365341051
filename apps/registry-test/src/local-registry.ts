/**
 * A real npm registry on this machine for the duration of a test: Verdaccio (a devDependency),
 * run by Node with its storage in a temp dir, on a free loopback port, with one user whose token
 * publishes. stop() ends the process and removes every file it made.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";

export interface LocalRegistry {
  /** Base URL with a trailing slash, e.g. http://127.0.0.1:41234/ */
  readonly url: string;
  /** A token of the registry's user, allowed to publish. */
  readonly token: string;
  /** The temp dir holding the registry's storage (removed by stop()). */
  readonly dir: string;
  stop(): Promise<void>;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function verdaccioBin(): string {
  const require = createRequire(import.meta.url);
  return join(dirname(require.resolve("verdaccio/package.json")), "bin", "verdaccio");
}

function config(storage: string): string {
  // No uplinks: the registry serves only what the test publishes; other scopes come from the
  // npm registry the machine is configured for.
  return [
    `storage: ${JSON.stringify(storage)}`,
    "auth:",
    "  htpasswd:",
    `    file: ${JSON.stringify(join(storage, "htpasswd"))}`,
    "    max_users: 10",
    "uplinks: {}",
    "packages:",
    "  '**':",
    "    access: $all",
    "    publish: $authenticated",
    "    unpublish: $authenticated",
    "max_body_size: 64mb",
    "log: { type: stdout, format: pretty, level: error }",
    "",
  ].join("\n");
}

async function waitUntilUp(url: string, child: ChildProcess, output: () => string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`verdaccio exited ${child.exitCode} before answering: ${output().trim().split("\n").slice(-5).join(" | ")}`);
    try {
      const r = await fetch(`${url}-/ping`);
      if (r.ok) return;
    } catch {
      // not listening yet
    }
    await sleep(100);
  }
  throw new Error(`verdaccio did not answer ${url}-/ping within 30 s: ${output().trim().split("\n").slice(-5).join(" | ")}`);
}

async function addUser(url: string): Promise<string> {
  const r = await fetch(`${url}-/user/org.couchdb.user:hybridgen-ci`, {
    method: "PUT",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ name: "hybridgen-ci", password: "registry-test-only" }),
  });
  const body = (await r.json()) as { token?: string; error?: string };
  if (!r.ok || !body.token) throw new Error(`verdaccio refused the test user: ${r.status} ${body.error ?? ""}`);
  return body.token;
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
  await exited;
  clearTimeout(timer);
}

export async function startLocalRegistry(): Promise<LocalRegistry> {
  const dir = mkdtempSync(join(tmpdir(), "hybridgen-registry-"));
  const storage = join(dir, "storage");
  const configPath = join(dir, "config.yaml");
  writeFileSync(configPath, config(storage));
  let lastError: unknown;
  // A port found free can be taken before Verdaccio binds it: try a few.
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = await freePort();
    const url = `http://127.0.0.1:${port}/`;
    const child = spawn("node", [verdaccioBin(), "--config", configPath, "--listen", `127.0.0.1:${port}`], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, NODE_NO_WARNINGS: "1" },
    });
    let output = "";
    child.stdout!.on("data", (d) => (output += d));
    child.stderr!.on("data", (d) => (output += d));
    child.once("error", (e) => (output += `\n${e.message}`));
    try {
      await waitUntilUp(url, child, () => output);
      const token = await addUser(url);
      return {
        url,
        token,
        dir,
        async stop() {
          await stopChild(child);
          rmSync(dir, { recursive: true, force: true });
        },
      };
    } catch (e) {
      lastError = e;
      await stopChild(child);
    }
  }
  rmSync(dir, { recursive: true, force: true });
  throw lastError;
}
