export const MAIN_HELP = `hybridgen — long-context LLM inference (HybridGen: CPU–GPU hybrid attention)

Usage:
  hybridgen generate [options]   generate text from a prompt (see hybridgen generate --help)
  hybridgen serve [options]      an OpenAI-compatible server with continuous batching (see hybridgen serve --help)
  hybridgen fetch                download and convert the default model (stories15M), print its directory
  hybridgen info [--json]        CPU kernels, CUDA devices, memory tiers (DRAM/CXL), model cache
  hybridgen inspect <model>      architecture, parameters, weight and KV-cache bytes (see --help)
  hybridgen plan                 where every byte of a hybrid run goes (GPU, host tiers, disk), predicted ms/token (see --help)
  hybridgen profile-kmin         K_min per selector and the layers that may speculate (see --help)
  hybridgen bench                decode speed of HybridGen and the baselines, tables and charts (see --help)
  hybridgen eval                 accuracy of HybridGen and the baselines against full attention (see --help)
  hybridgen --help | -h          this help
  hybridgen --version | -v       the version

Environment:
  HYBRIDGEN_CACHE     model cache directory (default ~/.cache/hybridgen)
  HYBRIDGEN_THREADS   CPU threads when --threads is not given (default: every core)
  HYBRIDGEN_DEBUG=1   print stack traces of internal errors
`;

export const GENERATE_HELP = `Usage: hybridgen generate [options]

Streams the prompt, then the generated text, to stdout; progress and timings go to stderr.

Model:
  -m, --model DIR              model directory (Hugging Face layout: config.json,
                               model.safetensors, tokenizer.json; Llama, Qwen2, OPT), or
                               preset:NAME with --dummy-weights (hybridgen inspect --help
                               lists the presets). Default: stories15M, downloaded and
                               converted on first use
      --dtype f32|f16|bf16     weight dtype at load (default: as stored; bf16 for --dummy-weights)
      --dummy-weights          deterministic random weights of the model's architecture instead
                               of its checkpoint (benchmarking); needed by --model preset:NAME
      --device auto|cpu|cuda   where the model runs (default auto: the GPU when CUDA is usable,
                               else the CPU, with the reason on stderr); or a backend
                               module (./my-backend.ts: its default export, a BackendEntry)
      --threads N              CPU threads (default: $HYBRIDGEN_THREADS or every core)
      --context N              KV cache positions (default: the model's, at most 4096)

Prompt (one of; default: read stdin):
  -p, --prompt TEXT            the prompt
  -f, --prompt-file FILE       read the prompt from a UTF-8 file
      --chat                   send the prompt as a user message through the model's chat
                               template (instruct models); only the reply is printed
      --system TEXT            a system message before it (with --chat)
      --prompts FILE           many prompts, one JSON object a line: {"prompt": "..."} with
                               optional "max_tokens", "temperature", "seed" (else the flags').
                               Prints one JSON line per prompt as it finishes (its "index" is
                               its position among the file's prompts); totals on stderr
      --batch N                decode N prompts together, 1 ≤ N ≤ 32 (with --prompts; default 1):
                               one forward pass a step for all N, a finished prompt's slot
                               takes the next one (continuous batching); with --attention hybrid,
                               each sequence has its own window, offloaded store and CPU stage

Sampling:
  -n, --max-tokens N           tokens to generate at most (default 256; the context may end it sooner)
  -t, --temperature X          0 = greedy (default 1)
      --top-k N                keep the N most likely tokens; 0 = off (default 0)
      --top-p P                nucleus sampling mass in (0, 1] (default 0.9)
      --repetition-penalty X   ≥ 1; 1 = off (default 1)
  -s, --seed N                 0 ≤ N < 2^32 (default: random)
      --stop TEXT              stop when TEXT is generated (repeatable; TEXT is not printed)

Output:
      --json                   print one JSON result object instead of streaming
      --verbose                the detail behind device choices (why the GPU was not used)
  -h, --help                   this help

Examples:
  hybridgen generate --prompt "Once upon a time" --temperature 0 --max-tokens 256
  echo "The little dog" | hybridgen generate --temperature 0.8 --seed 42 --json
  hybridgen generate --model preset:llama-3.2-1b --dummy-weights --prompt "x" -n 16
  hybridgen generate --prompts prompts.jsonl --batch 8 --temperature 0 -n 64 > results.jsonl
  hybridgen generate -p "Once upon a time" --attention hybrid --gpu-kv-budget 32 --scheduler feedback --k-min 8 --json
`;
