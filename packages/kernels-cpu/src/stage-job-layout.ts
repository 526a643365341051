/**
 * hg_stage_job (native/cpu_stage.h) as JS declares it, once: the fields in the struct's order
 * (every one 8 bytes, so one BigInt64Array / Float64Array pair fills it) and the flag bits. The
 * library reports its own size, offsets and flag values (hg_stage_job_size/offset/flag), and
 * checkStageJobLayout compares them at load, so a field added on one side only is a one-line
 * error instead of a job read at the wrong offsets. A new field or flag goes here and in the C
 * header and its name tables; nowhere else.
 */
import { fail } from "@hybridgen/spec";

/** The struct's fields, C names, in order; the doubles are listed in DOUBLE_FIELDS. */
export const STAGE_JOB_FIELDS = [
  "flags", "q", "k", "ktype", "kcap", "v", "vtype", "vcap", "n", "heads", "kv_heads", "head_dim",
  "all_logits", "lstride", "ids", "counts", "kmax", "budget", "sel_logits", "vstage", "kstage", "scale",
  "kq", "kq_form", "kq_from", "cand", "pages", "page_size", "page_cap", "pages_from",
  "ready", "ready_value", "done", "done_value", "sinks", "index_form", "super_pages", "lane",
] as const;
export type StageJobField = (typeof STAGE_JOB_FIELDS)[number];
const DOUBLE_FIELDS: ReadonlySet<StageJobField> = new Set(["scale"]);

/** The job's flag bits (HG_STAGE_<name>). */
export const STAGE_FLAGS = {
  SCORE: 1, TOPK: 2, SELECTED: 4, GATHER: 8, SHARED: 16, KEYS: 32, QUEST: 64, NO_ROWS: 128, DONE_IF_FAILED: 256, STREAM: 512, INDEX: 1024, CHOSEN: 2048,
} as const;
export type StageFlag = keyof typeof STAGE_FLAGS;

const FIELD_INDEX = Object.fromEntries(STAGE_JOB_FIELDS.map((f, i) => [f, i])) as Record<StageJobField, number>;

/** What the library says of its struct (-1: it has no field or flag of that name). */
export interface NativeJobLayout {
  readonly size: number;
  offset(field: string): number;
  flag(name: string): number;
}

/** Throws one line naming the first difference between this declaration and the library's struct. */
export function checkStageJobLayout(lib: NativeJobLayout, libraryPath: string): void {
  const rebuild = `${libraryPath} was built from another cpu_stage.h (run 'bun run build' in packages/kernels-cpu)`;
  const size = STAGE_JOB_FIELDS.length * 8;
  if (lib.size !== size) fail(`kernels-cpu: hg_stage_job is ${lib.size} bytes in the library, ${size} as JS declares it: ${rebuild}`, "ENATIVE");
  STAGE_JOB_FIELDS.forEach((f, i) => {
    const at = lib.offset(f);
    if (at !== i * 8) fail(`kernels-cpu: hg_stage_job field ${f} is ${at < 0 ? "missing" : `at byte ${at}`} in the library, at byte ${i * 8} as JS declares it: ${rebuild}`, "ENATIVE");
  });
  for (const [name, value] of Object.entries(STAGE_FLAGS)) {
    const v = lib.flag(name);
    if (v !== value) fail(`kernels-cpu: HG_STAGE_${name} is ${v < 0 ? "missing" : v} in the library, ${value} as JS declares it: ${rebuild}`, "ENATIVE");
  }
}

/** One hg_stage_job in JS memory, written field by field; `bytes` is what the FFI call passes. */
export class StageJobRecord {
  readonly bytes = new BigInt64Array(STAGE_JOB_FIELDS.length);
  private readonly doubles = new Float64Array(this.bytes.buffer);

  set(field: StageJobField, x: number): void {
    const i = FIELD_INDEX[field];
    if (DOUBLE_FIELDS.has(field)) this.doubles[i] = x;
    else this.bytes[i] = BigInt(x);
  }

  get(field: StageJobField): number {
    const i = FIELD_INDEX[field];
    return DOUBLE_FIELDS.has(field) ? this.doubles[i] : Number(this.bytes[i]);
  }
}
