import { describe, expect, it } from "vitest";
import { nativeStageJobLayout } from "../src/cpu-stage.js";
import { checkStageJobLayout, STAGE_FLAGS, STAGE_JOB_FIELDS, StageJobRecord, type NativeJobLayout } from "../src/stage-job-layout.js";

/** The library's answers with one changed: a field moved, dropped or a flag renumbered. */
function altered(real: NativeJobLayout, change: { size?: number; field?: [string, number]; flag?: [string, number] }): NativeJobLayout {
  return {
    size: change.size ?? real.size,
    offset: (f) => (change.field?.[0] === f ? change.field[1] : real.offset(f)),
    flag: (f) => (change.flag?.[0] === f ? change.flag[1] : real.flag(f)),
  };
}

describe("hg_stage_job's layout (declared once in JS, checked against the library at load)", () => {
  const real = nativeStageJobLayout();

  it("the built library's struct is the declared one: size, every field's offset, every flag", () => {
    expect(real.size).toBe(STAGE_JOB_FIELDS.length * 8);
    STAGE_JOB_FIELDS.forEach((f, i) => expect(real.offset(f)).toBe(i * 8));
    for (const [name, value] of Object.entries(STAGE_FLAGS)) expect(real.flag(name)).toBe(value);
    expect(real.offset("no_such_field")).toBe(-1);
    expect(real.flag("NO_SUCH_FLAG")).toBe(-1);
    expect(() => checkStageJobLayout(real, "lib.so")).not.toThrow();
  });

  it("a mismatch is one line naming the field or flag and the fix", () => {
    const cases: [NativeJobLayout, RegExp][] = [
      [altered(real, { size: real.size + 8 }), /hg_stage_job is \d+ bytes in the library, \d+ as JS declares it/],
      [altered(real, { field: ["sinks", 8] }), /field sinks is at byte 8 in the library, at byte \d+ as JS declares it/],
      [altered(real, { field: ["kq_form", -1] }), /field kq_form is missing in the library/],
      [altered(real, { flag: ["STREAM", 1024] }), /HG_STAGE_STREAM is 1024 in the library, 512 as JS declares it/],
    ];
    for (const [lib, message] of cases) {
      let error: Error | undefined;
      try {
        checkStageJobLayout(lib, "/x/libhgcpu.so");
      } catch (e) {
        error = e as Error;
      }
      expect(error?.message).toMatch(message);
      expect(error?.message).toContain("/x/libhgcpu.so was built from another cpu_stage.h");
      expect(error?.message.includes("\n")).toBe(false);
    }
  });

  it("a record writes 8-byte integers and the double fields as doubles, at the declared offsets", () => {
    const r = new StageJobRecord(), view = new DataView(r.bytes.buffer);
    r.set("kv_heads", 8);
    r.set("scale", 0.125);
    r.set("done", 2 ** 40 + 4);
    expect(view.getBigInt64(STAGE_JOB_FIELDS.indexOf("kv_heads") * 8, true)).toBe(8n);
    expect(view.getFloat64(STAGE_JOB_FIELDS.indexOf("scale") * 8, true)).toBe(0.125);
    expect(r.get("done")).toBe(2 ** 40 + 4);
    expect(r.get("scale")).toBe(0.125);
  });
});
