/** Waiting on work the user may interrupt (Ctrl-C aborts the CLI's signal). */

export const ABORTED = Symbol("aborted");

/** `work`, or ABORTED as soon as `signal` fires: Ctrl-C during a first-use download returns
 * at once (the download writes to a temp dir and renames, so leaving it is safe). */
export function untilAborted<T>(work: Promise<T>, signal: AbortSignal | undefined): Promise<T | typeof ABORTED> {
  if (!signal) return work;
  if (signal.aborted) return Promise.resolve(ABORTED);
  return new Promise((resolve, reject) => {
    const onAbort = () => resolve(ABORTED);
    signal.addEventListener("abort", onAbort, { once: true });
    work.then(
      (v) => (signal.removeEventListener("abort", onAbort), resolve(v)),
      (e) => (signal.removeEventListener("abort", onAbort), reject(e)),
    );
  });
}
