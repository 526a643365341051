/** Device-script helper: the value after `--name` on the command line, or `dflt`. */
export function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}
