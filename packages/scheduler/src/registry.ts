/**
 * Schedulers by name, beside @hybridgen/selectors' registerSelector: "fixed" and "feedback" are
 * registered here, a plugin adds its own, and the runtime builds whichever the options name from
 * the K, floor and timing it resolved, so no caller lists the names itself.
 */
import { HybridgenError, type Scheduler, type SelectionTiming } from "@hybridgen/spec";
import { FeedbackScheduler } from "./feedback-scheduler.js";
import { FixedScheduler } from "./fixed-scheduler.js";

/** What the runtime resolved for a scheduler it builds by name. */
export interface SchedulerContext {
  /** The first step's K (a fixed scheduler's K throughout). */
  readonly k: number;
  /** The accuracy floor K never goes below, for a scheduler that takes one (`takesKMin`). */
  readonly kMin: number;
  /** The first step's timing. */
  readonly timing: SelectionTiming;
  /** The timings the selector can run. */
  readonly timings: readonly SelectionTiming[];
}

export interface SchedulerEntry {
  readonly name: string;
  /** Whether its K option is a floor (kMin, from a profile's K_min) rather than the K of every step. */
  readonly takesKMin: boolean;
  readonly build: (ctx: SchedulerContext) => Scheduler;
}

const registry = new Map<string, SchedulerEntry>();

/** Adds a scheduler under `entry.name`; a name taken is an error. */
export function registerScheduler(entry: SchedulerEntry): void {
  if (!/^[a-z][a-z0-9-]*$/.test(entry.name)) throw new HybridgenError(`registerScheduler: name "${entry.name}" must be lower-case kebab-case`);
  if (registry.has(entry.name)) throw new HybridgenError(`registerScheduler: "${entry.name}" is registered already`);
  if (typeof entry.build !== "function") throw new HybridgenError(`registerScheduler("${entry.name}"): build must be a function`);
  registry.set(entry.name, entry);
}

/** The registered names, built-ins first. */
export function schedulerNames(): string[] {
  return [...registry.keys()];
}

/** The entry for `name`, or a one-line error listing the registered ones. */
export function lookupScheduler(name: string): SchedulerEntry {
  const e = registry.get(name);
  if (!e) throw new HybridgenError(`unknown scheduler "${name}" (registered: ${schedulerNames().join(", ")})`);
  return e;
}

registerScheduler({ name: "fixed", takesKMin: false, build: ({ k, timing }) => new FixedScheduler({ k, timing }) });
registerScheduler({
  name: "feedback",
  takesKMin: true,
  build: ({ k, kMin, timing, timings }) => new FeedbackScheduler({ kMin, k, timing, allowPre: timings.includes("pre"), returnToPost: timings.includes("post") }),
});
