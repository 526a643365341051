/**
 * The server's Prometheus metrics, hand-written (the text format is a few lines; a client
 * library would bring more than it saves): counters, gauges with labels, and histograms with
 * cumulative `le` buckets, `_sum` and `_count`, rendered as `text/plain; version=0.0.4`.
 */

type Labels = Readonly<Record<string, string>>;

const labelText = (l: Labels): string => {
  const keys = Object.keys(l);
  return keys.length ? `{${keys.map((k) => `${k}="${l[k]!.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`).join(",")}}` : "";
};
const num = (x: number): string => (Number.isFinite(x) ? String(x) : x > 0 ? "+Inf" : x < 0 ? "-Inf" : "NaN");

abstract class Metric {
  constructor(readonly name: string, readonly help: string, readonly type: "counter" | "gauge" | "histogram") {}
  abstract lines(): string[];
  render(): string {
    return [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} ${this.type}`, ...this.lines()].join("\n");
  }
}

/** A counter or gauge: one value per label set. */
export class Scalar extends Metric {
  private readonly values = new Map<string, { labels: Labels; value: number }>();
  constructor(name: string, help: string, type: "counter" | "gauge", initial: Labels[] = [{}]) {
    super(name, help, type);
    for (const l of initial) this.set(0, l);
  }
  private entry(l: Labels) {
    const key = labelText(l);
    let e = this.values.get(key);
    if (!e) this.values.set(key, (e = { labels: l, value: 0 }));
    return e;
  }
  inc(by = 1, l: Labels = {}): void {
    this.entry(l).value += by;
  }
  set(v: number, l: Labels = {}): void {
    this.entry(l).value = v;
  }
  get(l: Labels = {}): number {
    return this.values.get(labelText(l))?.value ?? 0;
  }
  lines(): string[] {
    return [...this.values.values()].map((e) => `${this.name}${labelText(e.labels)} ${num(e.value)}`);
  }
}

export class Histogram extends Metric {
  private readonly counts: number[];
  private sum = 0;
  private count = 0;
  constructor(name: string, help: string, readonly buckets: readonly number[]) {
    super(name, help, "histogram");
    this.counts = buckets.map(() => 0);
  }
  observe(v: number): void {
    this.sum += v;
    this.count++;
    for (let i = 0; i < this.buckets.length; i++) if (v <= this.buckets[i]!) this.counts[i]!++;
  }
  get observations(): number {
    return this.count;
  }
  lines(): string[] {
    return [
      ...this.buckets.map((b, i) => `${this.name}_bucket{le="${num(b)}"} ${this.counts[i]}`),
      `${this.name}_bucket{le="+Inf"} ${this.count}`,
      `${this.name}_sum ${num(this.sum)}`,
      `${this.name}_count ${this.count}`,
    ];
  }
}

const SECONDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** Every metric of `hybridgen serve` (names and help in the CLI README). */
export class ServeMetrics {
  readonly running = new Scalar("hybridgen_requests_running", "Requests holding a batch slot (prefilling or decoding).", "gauge");
  readonly queued = new Scalar("hybridgen_requests_queued", "Requests waiting for a slot or for room on the KV tiers.", "gauge");
  readonly slots = new Scalar("hybridgen_batch_slots", "Sequences the scheduler decodes together at most (--max-batch).", "gauge");
  readonly requests = new Scalar("hybridgen_requests_total", "Requests answered, by endpoint and HTTP status.", "counter", []);
  readonly finished = new Scalar("hybridgen_requests_finished_total", "Generations ended, by reason (stop, length, cancelled).", "counter", [{ reason: "stop" }, { reason: "length" }, { reason: "cancelled" }]);
  readonly promptTokens = new Scalar("hybridgen_prompt_tokens_total", "Prompt tokens prefilled.", "counter");
  readonly generated = new Scalar("hybridgen_generation_tokens_total", "Tokens generated.", "counter");
  readonly steps = new Scalar("hybridgen_decode_steps_total", "Batched decode steps (one forward pass for every decoding sequence).", "counter");
  readonly prefillChunks = new Scalar("hybridgen_prefill_chunks_total", "Prefill chunks run between decode steps.", "counter");
  readonly stepSeconds = new Histogram("hybridgen_decode_step_seconds", "Wall time of one batched decode step (the forward pass and the picks).", SECONDS);
  readonly chunkSeconds = new Histogram("hybridgen_prefill_chunk_seconds", "Wall time of one prefill chunk.", SECONDS);
  readonly decodeBytes = new Scalar("hybridgen_decode_bytes_total", "Bytes the decode steps must read, from the model's shape: device (weights once a step, each sequence's resident K and V) and link (a hybrid step's selected rows from the host).", "counter", [{ where: "device" }, { where: "link" }]);
  readonly prefillFlops = new Scalar("hybridgen_prefill_flops_total", "FLOPs the prefill chunks must compute, from the model's shape (matmuls and dense causal attention).", "counter");
  readonly prefillLinkBytes = new Scalar("hybridgen_prefill_link_bytes_total", "Bytes the prefill chunks bring up the link: with positions offloaded, every layer's store comes up for a chunk's attention over the whole context.", "counter");
  readonly renewSeconds = new Histogram("hybridgen_slot_renew_seconds", "Wall time of renewing a slot's sequence on the loop (a request's admission on its context, or back to idle as it leaves): its KV and, with hybrid attention, its store allocated and pinned, or unpinned and freed.", SECONDS);
  readonly reused = new Scalar("hybridgen_slot_reuses_total", "Requests that took the sequence a left request held in its slot, as it was (no renewal: its KV and, with hybrid attention, its pinned store reused).", "counter");
  readonly batchSize = new Scalar("hybridgen_batch_size", "Sequences in the last decode step.", "gauge");
  readonly batchSizes = new Histogram("hybridgen_batch_size_steps", "Sequences per decode step.", [1, 2, 4, 8, 16, 32]);
  readonly ttft = new Histogram("hybridgen_time_to_first_token_seconds", "From a request's arrival to its first token.", SECONDS);
  readonly tpot = new Histogram("hybridgen_time_per_output_token_seconds", "Between consecutive tokens of a request.", SECONDS);
  readonly e2e = new Histogram("hybridgen_request_duration_seconds", "From a request's arrival to its last token.", SECONDS);
  readonly kvBytes = new Scalar("hybridgen_kv_bytes", "KV bytes by tier: window (resident positions of running requests; the GPU window on a device), and the offloaded stores reserved on each host tier and on disk.", "gauge", [{ tier: "window" }]);
  readonly deviceReserved = new Scalar("hybridgen_device_bytes_reserved", "Device memory the running requests' sequences hold beyond idle slots (admission by bytes; 0 without a device or --gpu-mem).", "gauge");
  readonly deviceBudget = new Scalar("hybridgen_device_bytes_budget", "Device memory left for requests once the model and idle slots were loaded (admission's budget).", "gauge");
  readonly hybridK = new Scalar("hybridgen_hybrid_k", "Mean K (offloaded tokens selected per KV head and layer) of the last hybrid step's sequences.", "gauge");
  readonly hybridSteps = new Scalar("hybridgen_hybrid_steps_total", "Sequence-steps of hybrid attention, by selection timing.", "counter", [{ timing: "post" }, { timing: "pre" }]);
  readonly cpuStage = new Histogram("hybridgen_cpu_stage_seconds", "CPU-stage time of one sequence's hybrid step, summed over layers.", [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1]);
  readonly cpuStageTotal = new Scalar("hybridgen_cpu_stage_seconds_total", "CPU-stage time of every hybrid step, summed.", "counter");

  render(): string {
    return `${[
      this.running, this.queued, this.slots, this.requests, this.finished, this.promptTokens, this.generated, this.steps, this.prefillChunks,
      this.stepSeconds, this.chunkSeconds, this.decodeBytes, this.prefillFlops, this.prefillLinkBytes, this.renewSeconds, this.reused, this.batchSize, this.batchSizes, this.ttft, this.tpot, this.e2e, this.kvBytes, this.deviceReserved, this.deviceBudget, this.hybridK, this.hybridSteps, this.cpuStage, this.cpuStageTotal,
    ].map((m) => m.render()).join("\n")}\n`;
  }
}
