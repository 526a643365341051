/** Resolves on the next event-loop turn: signal handlers (Ctrl-C) run between tokens. */
export function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
