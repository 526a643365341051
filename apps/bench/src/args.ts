/** `--name value` flags of the bench scripts. */
export function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : fallback;
}

/** A comma-separated flag as a list (empty entries dropped). */
export function list(name: string, fallback: string): string[] {
  return arg(name, fallback).split(",").filter((x) => x !== "");
}
