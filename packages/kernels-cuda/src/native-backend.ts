/**
 * The backend's entry points in libhgcuda (native/context.cu, rowops.cu, matmul.cu,
 * attention.cu) through bun:ffi. Device addresses travel as numbers (`ptr`); host arrays as
 * typed arrays whose lengths the TypeScript side has checked. Ops return 0 or a CUDA error
 * code (10000 + status for cuBLAS), named by hg_cu_error_string.
 */
import { dlopen, FFIType } from "bun:ffi";

const { ptr, i32, f32, f64, void: none } = FFIType;

/** The native int scratch (ids, positions, slots, a gather's table) one call's indices go through. */
export const MAX_HOST_INTS = 1024 * 1024;

export const backendSymbols = {
  hg_cu_error_string: { args: [i32, ptr, i32], returns: none },
  hg_cu_mem_info: { args: [i32, ptr], returns: i32 },
  hg_cu_create: { args: [i32, f64, f64, ptr, i32, ptr, i32], returns: ptr },
  hg_cu_destroy: { args: [ptr], returns: none },
  hg_cu_heap_base: { args: [ptr], returns: f64 },
  hg_cu_heap_bytes: { args: [ptr], returns: f64 },
  hg_cu_arena_bytes: { args: [ptr], returns: f64 },
  hg_cu_num_sms: { args: [ptr], returns: i32 },
  hg_cu_cublas_info: { args: [ptr, ptr, i32], returns: none },
  hg_cu_sync: { args: [ptr], returns: i32 },
  hg_cu_upload: { args: [ptr, ptr, ptr, f64], returns: i32 },
  hg_cu_memset0: { args: [ptr, ptr, f64], returns: i32 },
  hg_cu_write: { args: [ptr, ptr, i32, ptr, f64], returns: i32 },
  hg_cu_read: { args: [ptr, ptr, ptr, i32, f64], returns: i32 },
  hg_cu_copy: { args: [ptr, ptr, i32, ptr, i32, f64], returns: i32 },
  hg_cu_embedding: { args: [ptr, ptr, ptr, i32, i32, ptr, i32], returns: i32 },
  hg_cu_rmsnorm: { args: [ptr, ptr, ptr, ptr, i32, i32, i32, f32], returns: i32 },
  hg_cu_layernorm: { args: [ptr, ptr, ptr, ptr, i32, ptr, i32, i32, i32, f32], returns: i32 },
  hg_cu_rope: { args: [ptr, ptr, i32, i32, ptr, i32, i32, ptr, ptr, i32], returns: i32 },
  hg_cu_silu_mul: { args: [ptr, ptr, ptr, ptr, f64], returns: i32 },
  hg_cu_relu: { args: [ptr, ptr, f64], returns: i32 },
  hg_cu_gelu: { args: [ptr, ptr, f64], returns: i32 },
  hg_cu_add: { args: [ptr, ptr, ptr, ptr, f64], returns: i32 },
  hg_cu_softmax: { args: [ptr, ptr, i32, i32, i32], returns: i32 },
  hg_cu_argmax: { args: [ptr, ptr, i32], returns: i32 },
  hg_cu_argmax_feed: { args: [ptr, ptr, i32, i32], returns: i32 },
  hg_cu_feed_result: { args: [ptr, i32, ptr], returns: i32 },
  hg_cu_embedding_feed: { args: [ptr, ptr, ptr, i32, i32], returns: i32 },
  hg_cu_matmul_path: { args: [ptr, i32], returns: i32 },
  hg_cu_matmul: { args: [ptr, ptr, ptr, ptr, i32, ptr, i32, i32, i32, i32, i32], returns: i32 },
  hg_cu_attn_logits: { args: [ptr, ptr, i32, ptr, ptr, i32, i32, i32, i32, i32, i32, ptr, i32, f32], returns: i32 },
  hg_cu_attn_aggregate: { args: [ptr, ptr, ptr, i32, ptr, i32, i32, i32, i32, i32, i32, ptr, i32, i32], returns: i32 },
  hg_cu_event_new: { args: [], returns: ptr },
  hg_cu_event_free: { args: [ptr], returns: none },
  hg_cu_event_record: { args: [ptr, ptr, i32], returns: i32 },
  hg_cu_stream_wait: { args: [ptr, i32, ptr], returns: i32 },
  hg_cu_event_elapsed: { args: [ptr, ptr, ptr], returns: i32 },
  hg_cu_copy_bandwidth: { args: [ptr, ptr, ptr, f64, i32, ptr], returns: i32 },
  hg_cu_gather_bench: { args: [ptr, ptr, ptr, ptr, ptr], returns: i32 },
  hg_cu_gather_rows: { args: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32], returns: i32 },
  hg_cu_gather_rows_at: { args: [ptr, ptr, ptr, ptr, i32, i32, i32, i32], returns: i32 },
  hg_cu_read_mapped: { args: [ptr, ptr, ptr, i32, i32, i32, i32], returns: i32 },
  hg_cu_pad_columns: { args: [ptr, ptr, ptr, i32, i32, i32, i32, i32], returns: i32 },
  hg_cu_read_bandwidth: { args: [ptr, ptr, f64, i32, i32, i32, i32, ptr], returns: i32 },
  hg_cu_test_fault: { args: [ptr, i32], returns: i32 },
  hg_cu_set_batch_copies: { args: [ptr, i32], returns: none },
  hg_cu_step_begin: { args: [ptr, i32], returns: i32 },
  hg_cu_step_end: { args: [ptr], returns: i32 },
  hg_cu_step_stats: { args: [ptr, ptr], returns: none },
  hg_cu_profiler: { args: [ptr, i32], returns: i32 },
  hg_cu_step_reset: { args: [ptr], returns: none },
  hg_cu_step_forget: { args: [ptr, i32], returns: none },
  hg_cu_step_info: { args: [ptr, ptr, i32], returns: none },
  hg_cu_set_plan_major: { args: [ptr, i32], returns: i32 },
  hg_cu_get_plan_major: { args: [ptr], returns: i32 },
  hg_cu_flash_variant: { args: [i32], returns: i32 },
  hg_cu_attn_causal: { args: [ptr, ptr, ptr, i32, ptr, ptr, i32, i32, i32, i32, i32, i32, i32, i32, f32], returns: i32 },
  hg_cu_attn_causal_path: { args: [i32, i32], returns: i32 },
  hg_cu_attn_decode: { args: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, i32, i32, f32], returns: i32 },
  hg_cu_attn_decode_path: { args: [i32, i32], returns: i32 },
  hg_cu_attn_decode_batch: { args: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, ptr, f32], returns: i32 },
  hg_cu_index_rank_scratch: { args: [ptr, i32, i32, i32, i32, i32, i32], returns: i32 },
  hg_cu_index_rank: { args: [ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, i32, i32, i32], returns: i32 },
  hg_cu_index_rank_rows: { args: [ptr, ptr, i32, i32, i32, i32, i32, i32, i32, i32], returns: i32 },
  hg_cu_side: { args: [ptr, i32], returns: i32 },
  hg_cu_attn_partial: { args: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, ptr, i32, f32], returns: i32 },
  hg_cu_attn_merge: { args: [ptr, ptr, ptr, ptr, i32, ptr, i32, i32, i32, i32, i32, i32, i32], returns: i32 },
  hg_cu_attn_merge_rows: { args: [ptr, ptr, i32, i32, i32, i32, i32, i32], returns: i32 },
  hg_cu_attn_partial_rows: { args: [ptr, ptr, i32, i32, i32, i32, i32, i32, f32], returns: i32 },
  hg_cu_window_append_rows: { args: [ptr, ptr, i32, i32, i32, i32, i32], returns: i32 },
  hg_cu_matmul_path_for: { args: [ptr, i32, i32, i32], returns: i32 },
  hg_cu_set_skinny: { args: [ptr, i32, i32], returns: i32 },
  hg_cu_matmul_rows: { args: [ptr, ptr, ptr, ptr, i32, i32, i32, i32, ptr, ptr, i32, ptr, i32, i32, i32], returns: i32 },
  hg_cu_argmax_rows: { args: [ptr, ptr, i32, i32, ptr, ptr], returns: i32 },
  hg_cu_matvec: { args: [ptr, ptr, ptr, ptr, i32, ptr, i32, ptr, i32, f32, i32, i32, i32], returns: i32 },
  hg_cu_matvec_max_norm_k: { args: [], returns: i32 },
  // host link (native/host_copy.cu): pinned memory, copy stream, event timeline, signal words
  hg_link_create: { args: [ptr], returns: ptr },
  hg_link_destroy: { args: [ptr], returns: none },
  hg_host_pin: { args: [ptr, f64], returns: i32 },
  hg_host_unpin: { args: [ptr], returns: i32 },
  hg_host_device_ptr: { args: [ptr, ptr], returns: i32 },
  hg_link_copy: { args: [ptr, i32, ptr, i32], returns: i32 },
  hg_link_mark: { args: [ptr, i32], returns: i32 },
  hg_link_fence: { args: [ptr], returns: i32 },
  hg_link_send_signalled: { args: [ptr, ptr, ptr, f64, ptr], returns: i32 },
  hg_link_stage_signal: { args: [ptr, ptr], returns: i32 },
  hg_link_await_signal: { args: [ptr, ptr, f64], returns: i32 },
  hg_link_hand_off_rows: { args: [ptr, ptr, i32, ptr, i32], returns: i32 },
  hg_link_rescore_rows: { args: [ptr, ptr, i32, i32, i32, i32, i32], returns: i32 },
  hg_link_keep_rows: { args: [ptr, ptr, i32], returns: i32 },
  hg_link_send_rows: { args: [ptr, ptr, i32, ptr], returns: i32 },
  hg_link_set_timeout: { args: [ptr, f64], returns: i32 },
  hg_link_gave_up: { args: [ptr, ptr], returns: i32 },
  hg_link_times: { args: [ptr, ptr], returns: i32 },
  hg_link_bandwidth: { args: [ptr, ptr, f64, i32, ptr], returns: i32 },
  hg_link_error: { args: [ptr, ptr, i32, ptr], returns: none },
  // rows fetched ahead (native/row_fetch.cu): a side stream's gathers, slots ordered by events
  hg_fetch_create: { args: [ptr], returns: ptr },
  hg_fetch_rows: { args: [ptr, i32, ptr, f64, ptr, i32], returns: i32 },
  hg_fetch_rows_batch: { args: [ptr, i32, ptr, i32, ptr, i32], returns: i32 },
  hg_fetch_mark: { args: [ptr, i32, i32], returns: i32 },
  hg_fetch_destroy: { args: [ptr], returns: none },
} as const;

/** The functions the backend calls; a test can hand the backend a stand-in with the same shape. */
export type CudaNative = ReturnType<typeof dlopen<typeof backendSymbols>>["symbols"];

const loaded = new Map<string, CudaNative>();

/** Opens the backend's symbols of the library at `path` (once per process and path). */
export function openCudaNative(path: string): CudaNative {
  let lib = loaded.get(path);
  if (!lib) {
    lib = dlopen(path, backendSymbols).symbols;
    loaded.set(path, lib);
  }
  return lib;
}

/** "cudaErrorX: text" for a code an op returned. */
export function cudaErrorString(native: CudaNative, code: number): string {
  const buf = new Uint8Array(512);
  native.hg_cu_error_string(code, buf, buf.length);
  const end = buf.indexOf(0);
  return new TextDecoder().decode(end < 0 ? buf : buf.subarray(0, end));
}
