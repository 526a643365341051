import type { CliIo } from "./io.js";

/** CliIo over the real process. `flush` waits until stdout/stderr have taken every byte,
 * so exiting right after does not cut a piped stream short. */
export function processIo(signal: AbortSignal): CliIo & { flush(): Promise<void> } {
  const drain = (stream: NodeJS.WriteStream) =>
    new Promise<void>((resolve) => {
      if (stream.writableLength === 0) resolve();
      else stream.write("", () => resolve());
    });
  return {
    stdout: (chunk) => void process.stdout.write(chunk),
    stderr: (chunk) => void process.stderr.write(chunk),
    async readStdin() {
      const chunks: Uint8Array[] = [];
      for await (const chunk of process.stdin) chunks.push(chunk as Uint8Array);
      return Buffer.concat(chunks);
    },
    env: process.env,
    signal,
    flush: async () => {
      await Promise.all([drain(process.stdout), drain(process.stderr)]);
    },
  };
}
