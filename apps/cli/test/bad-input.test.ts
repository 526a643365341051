import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BIN, requireBuiltBin, runBin, type RunResult } from "./helpers.js";
import { stories15M } from "./model-fixture.js";

/** What every bad input must look like: nothing on stdout, one `error:` line, exit ≠ 0. */
function expectOneLineError(r: RunResult, message: RegExp) {
  expect(r.signal).toBeNull();
  expect(r.code).not.toBe(0);
  expect(r.code).not.toBeNull();
  expect(r.stdout).toBe("");
  const lines = r.stderr.split("\n").filter((l) => l !== "");
  expect(lines, r.stderr).toHaveLength(1);
  expect(lines[0]).toMatch(/^error: /);
  expect(lines[0]).toMatch(message);
  expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace
}

let model = "";
let tmp = "";
beforeAll(async () => {
  requireBuiltBin();
  model = await stories15M();
  tmp = mkdtempSync(join(tmpdir(), "hybridgen-cli-test-"));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe("the built bin", () => {
  it("runs through its #! line and prints the version", () => {
    const r = runBin(["--version"]);
    const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`hybridgen ${pkg.version}\n`);
    expect(BIN.endsWith("dist/hybridgen.js")).toBe(true);
  });

  it("prints help for hybridgen, --help and generate --help", () => {
    for (const args of [[], ["--help"], ["-h"], ["help"]]) {
      const r = runBin(args);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain("hybridgen generate");
    }
    const g = runBin(["generate", "--help"]);
    expect(g.code).toBe(0);
    for (const flag of ["--model", "--prompt", "--prompt-file", "--max-tokens", "--temperature", "--top-k", "--top-p", "--repetition-penalty", "--seed", "--stop", "--threads", "--dtype", "--json"]) {
      expect(g.stdout).toContain(flag);
    }
  });
});

describe("bad input gives one line and a non-zero exit", () => {
  const flagCases: [string, string[], RegExp][] = [
    ["unknown command", ["generat"], /unknown command "generat"/],
    ["unknown top-level flag", ["--frobnicate"], /unknown option --frobnicate/],
    ["unknown generate flag", ["generate", "--frobnicate", "1"], /unknown option --frobnicate/],
    ["non-numeric --max-tokens", ["generate", "--max-tokens", "ten"], /--max-tokens: "ten" is not a number/],
    ["zero --max-tokens", ["generate", "--max-tokens", "0"], /--max-tokens/],
    ["negative --temperature", ["generate", "--temperature=-1"], /--temperature/],
    ["--top-p above 1", ["generate", "--top-p", "2"], /--top-p/],
    ["fractional --threads", ["generate", "--threads", "1.5"], /--threads/],
    ["bad --dtype", ["generate", "--dtype", "int8"], /--dtype/],
    ["flag without value", ["generate", "--prompt"], /--prompt needs a value/],
  ];
  for (const [name, args, message] of flagCases) {
    it(name, () => expectOneLineError(runBin(args), message));
  }

  it("an empty prompt: by flag, on stdin, in a file, on a --prompts line", () => {
    expectOneLineError(runBin(["generate", "--model", model, "--prompt", ""]), /^error: the prompt is empty \(--prompt holds no text\)$/);
    expectOneLineError(runBin(["generate", "--model", model], { input: " \n\n" }), /^error: the prompt is empty \(the prompt on stdin holds no text\)$/);
    const file = join(tmp, "empty-prompt.txt"), lines = join(tmp, "empty-prompt.jsonl");
    writeFileSync(file, "");
    writeFileSync(lines, '{"prompt": "Once"}\n{"prompt": "  "}\n');
    expectOneLineError(runBin(["generate", "--model", model, "--prompt-file", file]), /^error: the prompt is empty \(prompt file .*empty-prompt\.txt holds no text\)$/);
    expectOneLineError(runBin(["generate", "--model", model, "--prompts", lines]), /line 2: "prompt" is empty \(got "  "\)$/);
  });

  it("missing model directory", () => {
    const dir = join(tmp, "no-such-model");
    expectOneLineError(runBin(["generate", "--model", dir, "--prompt", "hi"]), new RegExp(dir.replace(/[/.]/g, "\\$&")));
  });

  it("model directory without weights", () => {
    const dir = join(tmp, "no-weights");
    copyModelParts(model, dir, ["config.json", "tokenizer.json"]);
    expectOneLineError(runBin(["generate", "--model", dir, "--prompt", "hi"]), /safetensors/);
  });

  it("corrupt model.safetensors (random bytes)", () => {
    const dir = join(tmp, "corrupt-weights");
    copyModelParts(model, dir, ["config.json", "tokenizer.json", "generation_config.json"]);
    let s = 7;
    const junk = Uint8Array.from({ length: 4096 }, () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) >>> 24));
    writeFileSync(join(dir, "model.safetensors"), junk);
    expectOneLineError(runBin(["generate", "--model", dir, "--prompt", "hi"]), /model\.safetensors/);
  });

  it("truncated model.safetensors", () => {
    const dir = join(tmp, "truncated-weights");
    copyModelParts(model, dir, ["config.json", "tokenizer.json"]);
    writeFileSync(join(dir, "model.safetensors"), readFileSync(join(model, "model.safetensors")).subarray(0, 100_000));
    expectOneLineError(runBin(["generate", "--model", dir, "--prompt", "hi"]), /model\.safetensors/);
  });

  it("config.json that is not JSON", () => {
    const dir = join(tmp, "bad-config");
    copyModelParts(model, dir, ["tokenizer.json", "model.safetensors"]);
    writeFileSync(join(dir, "config.json"), "{ not json");
    expectOneLineError(runBin(["generate", "--model", dir, "--prompt", "hi"]), /config\.json/);
  });

  it("prompt longer than the model's context", () => {
    const prompt = "the cat sat on the mat and ".repeat(60); // ≈ 420 tokens > 256
    expectOneLineError(runBin(["generate", "--model", model, "--prompt", prompt]), /context/);
  });

  it("non-UTF-8 prompt file", () => {
    const file = join(tmp, "latin1.txt");
    writeFileSync(file, Uint8Array.from([0x4f, 0x6e, 0x63, 0x65, 0x20, 0xe9, 0x74, 0xe9])); // "Once été" in Latin-1
    expectOneLineError(runBin(["generate", "--model", model, "--prompt-file", file]), /not valid UTF-8.*offset 5/);
  });

  it("non-UTF-8 prompt on stdin", () => {
    expectOneLineError(runBin(["generate", "--model", model], { input: Uint8Array.from([0x68, 0x69, 0xff]) }), /stdin is not valid UTF-8/);
  });

  it("missing prompt file", () => {
    expectOneLineError(runBin(["generate", "--model", model, "--prompt-file", join(tmp, "nope.txt")]), /cannot read prompt file .*nope\.txt: no such file/);
  });
});

function copyModelParts(from: string, to: string, names: string[]) {
  rmSync(to, { recursive: true, force: true });
  mkdirSync(to, { recursive: true });
  for (const n of names) copyFileSync(join(from, n), join(to, n));
}
