/**
 * A stand-in for a backend that records decode steps (beginStep/endStep: CUDA graphs on a GPU):
 * the Recorder defers every op between beginStep and endStep and runs them at endStep, as a
 * replayed graph would (views, host handles, are made at once); a read, a write, an allocation or
 * a host-link copy inside a segment throws.
 */
import type { Backend, HostCopy, ReferenceBackend } from "@hybridgen/core";
import { type AddressBook, SignallingLink } from "@hybridgen/core/testing";

/** Backend methods that talk to the host or manage memory: never inside a recorded segment. */
const HOST_SIDE = new Set(["read", "write", "alloc", "free", "argmax", "liveTensors", "close", "hostTransfers"]);

export class Recorder {
  recording = false;
  segments = 0;
  keys = new Set<string>();
  private queue: (() => void)[] = [];
  private readonly views = new WeakSet<object>();

  wrap(inner: ReferenceBackend): Backend {
    return new Proxy(inner, {
      get: (target, prop, receiver) => {
        if (prop === "beginStep") return (key: string) => this.begin(key);
        if (prop === "endStep") return () => this.end();
        const v = Reflect.get(target, prop, receiver);
        if (typeof v !== "function" || typeof prop !== "string") return v;
        // Views are handles, made and dropped at once (a CUDA view touches no device memory).
        if (prop === "view") {
          return (...args: unknown[]) => {
            const view = v.apply(target, args) as object;
            this.views.add(view);
            return view;
          };
        }
        if (prop === "free") {
          return (t: object) => {
            if (this.recording && !this.views.has(t)) throw new Error("free() inside a recorded segment");
            return v.call(target, t);
          };
        }
        return (...args: unknown[]) => {
          if (!this.recording) return v.apply(target, args);
          if (HOST_SIDE.has(prop)) throw new Error(`${prop}() inside a recorded segment`);
          this.queue.push(() => v.apply(target, args));
          return undefined;
        };
      },
    }) as unknown as Backend;
  }

  begin(key: string): void {
    if (this.recording) throw new Error("beginStep inside a recorded segment");
    this.recording = true;
    this.keys.add(key);
  }

  end(): void {
    if (!this.recording) throw new Error("endStep without beginStep");
    this.recording = false;
    this.segments++;
    for (const op of this.queue) op();
    this.queue = [];
  }

  check(what: string): void {
    if (this.recording) throw new Error(`${what} inside a recorded segment`);
  }

  /** A device op of the link's: recorded with the segment's ops, or run now. */
  schedule(op: () => void): void {
    if (this.recording) this.queue.push(op);
    else op();
  }
}

/** The loopback link (with signalled sends when `signals`), refusing copies and fences while a segment is being recorded. */
export class CheckedLink extends SignallingLink {
  constructor(device: ReferenceBackend, host: ReferenceBackend, book: AddressBook, private readonly rec: Recorder | null, signals: boolean) {
    super(device, host, book, signals, (op) => (rec ? rec.schedule(op) : op()));
  }
  override toHost(copies: readonly HostCopy[]): void {
    this.rec?.check("toHost");
    super.toHost(copies);
  }
  override toDevice(copies: readonly HostCopy[]): void {
    this.rec?.check("toDevice");
    super.toDevice(copies);
  }
  override fence(): void {
    this.rec?.check("fence");
    super.fence();
  }
}
