import { isAbsolute, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * Absolute path of a package's native library: `explicit`, else the environment variable
 * `env`, else `beside` — the library's place next to the calling module, given as
 * `new URL("../lib/libx.so", import.meta.url)` so it holds in src/ and in the built dist/.
 * dlopen wants an absolute path (a bare name would search the loader's paths instead), so a
 * relative override is taken from the working directory.
 */
export function resolveNativeLibrary(env: string, beside: URL, explicit?: string): string {
  const chosen = explicit ?? process.env[env];
  if (chosen) return isAbsolute(chosen) ? chosen : resolve(chosen);
  return fileURLToPath(beside);
}
