import { describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/core";
import { GenerateCliOptionsSchema } from "../src/generate-options.js";
import { parseGenerateArgs } from "../src/parse-generate-args.js";
import { firstInvalidUtf8Offset } from "../src/read-prompt.js";
import { rng } from "./helpers.js";

describe("parseGenerateArgs", () => {
  it("applies the documented defaults", () => {
    expect(parseGenerateArgs([])).toEqual({
      maxTokens: 256,
      temperature: 1,
      topK: 0,
      topP: 0.9,
      repetitionPenalty: 1,
      stop: [],
      json: false,
      verbose: false,
      chat: false,
      dummyWeights: false,
      device: "auto",
      help: false,
    });
  });

  it("round-trips random valid option sets through flags (seeded)", () => {
    const rand = rng(0x5eed);
    const pick = <T>(xs: readonly T[]) => xs[Math.floor(rand() * xs.length)]!;
    for (let trial = 0; trial < 300; trial++) {
      // Reference: the option object we mean; the flags are rendered from it.
      const want = {
        model: `/models/m${trial}`,
        prompt: pick(["Once upon a time", "-starts with a dash", "ünïcødé ✓", ""]),
        maxTokens: 1 + Math.floor(rand() * 4096),
        temperature: Math.round(rand() * 200) / 100,
        topK: Math.floor(rand() * 100),
        topP: Math.max(0.01, Math.round(rand() * 100) / 100),
        repetitionPenalty: 1 + Math.round(rand() * 100) / 100,
        seed: Math.floor(rand() * 0xffffffff),
        stop: Array.from({ length: Math.floor(rand() * 3) }, (_, i) => `stop${i}-${trial}`),
        threads: 1 + Math.floor(rand() * 8),
        context: 1 + Math.floor(rand() * 8192),
        dtype: pick(["f32", "f16", "bf16"] as const),
        json: rand() < 0.5,
        verbose: rand() < 0.5,
        chat: true,
        system: pick(["Be brief.", "", "--dash"]),
        dummyWeights: rand() < 0.5,
        device: pick(["auto", "cpu", "cuda"] as const),
      };
      const argv = [
        ...(rand() < 0.5 ? ["--model", want.model] : [`--model=${want.model}`]),
        `--prompt=${want.prompt}`,
        ...(rand() < 0.5 ? ["-n", String(want.maxTokens)] : ["--max-tokens", String(want.maxTokens)]),
        "--temperature", String(want.temperature),
        "--top-k", String(want.topK),
        "--top-p", String(want.topP),
        "--repetition-penalty", String(want.repetitionPenalty),
        "--seed", String(want.seed),
        ...want.stop.flatMap((s) => ["--stop", s]),
        "--threads", String(want.threads),
        "--context", String(want.context),
        "--dtype", want.dtype,
        ...(want.json ? ["--json"] : []),
        ...(want.verbose ? ["--verbose"] : []),
        "--chat",
        `--system=${want.system}`,
        ...(want.dummyWeights ? ["--dummy-weights"] : []),
        "--device", want.device,
      ];
      expect(parseGenerateArgs(argv)).toEqual({ ...want, help: false });
    }
  });

  const bad: [string[], RegExp][] = [
    [["--max-tokens", "abc"], /--max-tokens: "abc" is not a number/],
    [["--max-tokens", "0"], /--max-tokens.*at least 1/],
    [["--max-tokens", "1.5"], /--max-tokens.*integer/],
    [["--max-tokens=-3"], /--max-tokens.*at least 1/],
    [["--max-tokens", "-3"], /--max-tokens needs a value/],
    [["--temperature=-0.1"], /--temperature.*≥ 0/],
    [["--temperature", "1e400"], /--temperature/],
    [["--temperature", "0x10"], /--temperature: "0x10" is not a number/],
    [["--top-p", "0"], /--top-p.*> 0/],
    [["--top-p", "1.5"], /--top-p.*≤ 1/],
    [["--top-k", "-1"], /--top-k/],
    [["--repetition-penalty", "0.5"], /--repetition-penalty.*≥ 1/],
    [["--seed", "4294967296"], /--seed/],
    [["--seed", ""], /--seed: "" is not a number/],
    [["--threads", "0"], /--threads.*at least 1/],
    [["--threads", "300"], /--threads.*≤ 256/],
    [["--context", "0"], /--context.*at least 1/],
    [["--system", "be nice"], /--system needs --chat/],
    [["--dtype", "f64"], /--dtype.*f32, f16, bf16/],
    [["--stop", ""], /--stop.*empty/],
    [["--bogus"], /unknown option --bogus/],
    [["-x"], /unknown option -x/],
    [["--prompt"], /--prompt needs a value/],
    [["-n", "-3"], /--max-tokens needs a value/],
    [["--json=yes"], /--json takes no value/],
    [["stray"], /unexpected argument "stray"/],
    [["--prompt", "a", "--prompt-file", "b"], /either --prompt or --prompt-file/],
  ];
  for (const [argv, message] of bad) {
    it(`rejects ${JSON.stringify(argv)} with one clear line`, () => {
      let error: unknown;
      try {
        parseGenerateArgs(argv);
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(HybridgenError);
      expect((error as Error).message).toMatch(message);
      expect((error as Error).message).not.toContain("\n");
    });
  }

  it("exports a schema programs can use on their own", () => {
    expect(GenerateCliOptionsSchema.safeParse({ maxTokens: 5, temperature: 0 }).success).toBe(true);
    expect(GenerateCliOptionsSchema.safeParse({ maxTokens: 0 }).success).toBe(false);
    expect(GenerateCliOptionsSchema.safeParse({ unknown: 1 }).success).toBe(false);
  });
});

describe("firstInvalidUtf8Offset", () => {
  it("agrees with the WHATWG fatal decoder on random byte strings (seeded)", () => {
    const rand = rng(1234);
    const strict = new TextDecoder("utf-8", { fatal: true });
    const valid = (b: Uint8Array) => {
      try {
        strict.decode(b);
        return true;
      } catch {
        return false;
      }
    };
    const samples = [..."aé€😀", "\u{10FFFF}"].map((c) => new TextEncoder().encode(c));
    for (let trial = 0; trial < 3000; trial++) {
      const parts: number[] = [];
      const n = 1 + Math.floor(rand() * 12);
      for (let i = 0; i < n; i++) {
        if (rand() < 0.7) parts.push(...samples[Math.floor(rand() * samples.length)]!);
        else parts.push(Math.floor(rand() * 256));
      }
      const bytes = new Uint8Array(parts);
      const at = firstInvalidUtf8Offset(bytes);
      if (valid(bytes)) {
        expect(at).toBe(-1);
      } else {
        // The prefix before the reported byte decodes; the reported sequence does not.
        expect(at).toBeGreaterThanOrEqual(0);
        expect(valid(bytes.subarray(0, at))).toBe(true);
        let longest = 0;
        for (let end = at + 1; end <= Math.min(bytes.length, at + 4); end++) if (valid(bytes.subarray(0, end))) longest = end;
        expect(longest).toBe(0);
      }
    }
  });
});
