/** Many prefill samples' rows in one array (the calibrator's stash, read once), as the sums' kernels read it. */
export interface CalibrationBatch {
  /** Rows of `width` floats. */
  readonly data: Float32Array;
  readonly width: number;
  /** Query heads of a sample (one KV head's group): `group` rows from each first row. */
  readonly group: number;
  /** Per sample, five fields: q's logits' first row, q̃'s (-1: none, layer 0), q's probabilities', from, to. */
  readonly samples: Int32Array;
  readonly grid: readonly number[];
  readonly candidates: number;
}
