/**
 * What the CLI touches of the outside world, passed in so tests can run `runCli` in process
 * and the bin can hand it the real process.
 */
export interface CliIo {
  /** Text or raw bytes for stdout (tokens are streamed here as they are produced). */
  stdout(chunk: string): void;
  /** Progress, timings and error lines. */
  stderr(chunk: string): void;
  /** Reads all of stdin (used when neither --prompt nor --prompt-file is given). */
  readStdin(): Promise<Uint8Array>;
  /** Environment (HYBRIDGEN_CACHE, HYBRIDGEN_DEBUG, ...). */
  env: Record<string, string | undefined>;
  /** Aborted when the user presses Ctrl-C; generation stops and the CLI exits 130. */
  signal?: AbortSignal;
  /** The arguments' raw bytes (the bin's, from the kernel): checked for UTF-8 before anything runs. */
  rawArgs?: readonly Uint8Array[];
  /**
   * Called with true before a long uninterruptible step (model load) and false after it: the bin
   * then lets Ctrl-C end the process at once instead of waiting for the step to return.
   */
  uninterruptible?(on: boolean): void;
}

/** An io that collects output in strings: handy for tests and for embedding the CLI. */
export function bufferedIo(options: { stdin?: Uint8Array | string; env?: Record<string, string | undefined>; signal?: AbortSignal } = {}): CliIo & { out: string; err: string } {
  const io = {
    out: "",
    err: "",
    stdout(chunk: string) {
      io.out += chunk;
    },
    stderr(chunk: string) {
      io.err += chunk;
    },
    async readStdin() {
      const s = options.stdin ?? new Uint8Array(0);
      return typeof s === "string" ? new TextEncoder().encode(s) : s;
    },
    env: options.env ?? {},
    signal: options.signal,
  };
  return io;
}
