/** Memory tier kinds by registration: the built-ins' facts, a new kind accepted by the tier schema once registered, bad names refused. */
import { describe, expect, it } from "vitest";
import { isFileTier, MemoryTierSchema, registerTierKind, tierKind, tierKindNames } from "../src/index.js";

describe("tier kinds", () => {
  it("dram, cxl and file, fastest first, with what each is", () => {
    expect(tierKindNames().slice(0, 3)).toEqual(["dram", "cxl", "file"]);
    expect([tierKind("dram").rank, tierKind("cxl").rank, tierKind("file").rank]).toEqual([0, 1, 2]);
    expect([tierKind("dram").local, tierKind("cxl").local, tierKind("file").local]).toEqual([true, false, false]);
    expect(isFileTier({ kind: "file" })).toBe(true);
    expect(isFileTier({ kind: "cxl" })).toBe(false);
    expect(tierKind("file").label("file:/mnt/kv")).toBe("disk");
    expect(tierKind("cxl").label("node2")).toBe("node2");
  });

  it("a tier of an unregistered kind is refused by the schema until its kind is registered", () => {
    const hbm = { id: "hbm0", kind: "hbm-pool", capacityBytes: 1024 };
    const r = MemoryTierSchema.safeParse(hbm);
    expect(r.success).toBe(false);
    expect(r.error?.issues[0]?.message).toBe("must be a registered tier kind (dram, cxl, file)");
    registerTierKind({ name: "hbm-pool", rank: -1, fileBacked: false, local: true, label: (id) => id });
    expect(MemoryTierSchema.parse(hbm).kind).toBe("hbm-pool");
    expect(() => registerTierKind({ name: "dram", rank: 0, fileBacked: false, local: true, label: (id) => id })).toThrow('registerTierKind: "dram" is registered already');
    expect(() => tierKind("tape")).toThrow(/^unknown memory tier kind "tape" \(registered: dram, cxl, file, hbm-pool\)$/);
  });

  it("a file tier still needs a path", () => {
    expect(MemoryTierSchema.safeParse({ id: "f", kind: "file", capacityBytes: 1 }).error?.issues[0]?.message).toBe("a file tier needs a path");
  });
});
