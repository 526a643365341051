import { ensureStories15M } from "@hybridgen/core";
import type { CliIo } from "../io.js";

/** `hybridgen fetch`: download + convert the default model (stories15M); prints its directory. */
export async function runFetch(io: CliIo): Promise<number> {
  const dir = await ensureStories15M({ cacheDir: io.env.HYBRIDGEN_CACHE, onProgress: (m) => io.stderr(`${m}\n`) });
  io.stdout(`${dir}\n`);
  return 0;
}
