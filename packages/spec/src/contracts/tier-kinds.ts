/**
 * Memory tier kinds, registered: what the planner, the placement and the CLI need to know of a
 * kind is a record looked up by its name, not a comparison with a name at each use. "dram", "cxl"
 * and "file" are registered here; a new kind (an HBM pool, a remote store) is one registration.
 */
import { HybridgenError } from "../errors.js";

export interface TierKind {
  readonly name: string;
  /** Speed order among kinds: a lower rank reads faster (dram 0, cxl 1, file 2). */
  readonly rank: number;
  /** Its bytes live in files under the tier's `path`: no NUMA node to bind, no RAM headroom, a path required. */
  readonly fileBacked: boolean;
  /** Memory of a node with CPUs of its own (local DRAM): where K, read every step, goes first. */
  readonly local: boolean;
  /** How a listing names a tier of this kind, given its id ("disk" for a file tier). */
  readonly label: (id: string) => string;
}

const kinds = new Map<string, TierKind>();

/** Adds a tier kind; a name taken is an error. */
export function registerTierKind(kind: TierKind): void {
  if (!/^[a-z][a-z0-9-]*$/.test(kind.name)) throw new HybridgenError(`registerTierKind: name "${kind.name}" must be lower-case kebab-case`);
  if (kinds.has(kind.name)) throw new HybridgenError(`registerTierKind: "${kind.name}" is registered already`);
  kinds.set(kind.name, Object.freeze({ ...kind }));
}

/** The registered kind names, in registration order. */
export function tierKindNames(): string[] {
  return [...kinds.keys()];
}

/** The kind `name` stands for, or a one-line error listing the registered ones. */
export function tierKind(name: string): TierKind {
  const k = kinds.get(name);
  if (!k) throw new HybridgenError(`unknown memory tier kind "${name}" (registered: ${tierKindNames().join(", ")})`);
  return k;
}

/** Whether a tier of this kind keeps its bytes in files (false for an unknown kind: the schema names that one). */
export const isFileTier = (t: { readonly kind: string }): boolean => kinds.get(t.kind)?.fileBacked === true;

const own = (id: string) => id;
registerTierKind({ name: "dram", rank: 0, fileBacked: false, local: true, label: own });
registerTierKind({ name: "cxl", rank: 1, fileBacked: false, local: false, label: own });
registerTierKind({ name: "file", rank: 2, fileBacked: true, local: false, label: () => "disk" });
