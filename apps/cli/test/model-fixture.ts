import { readFileSync } from "node:fs";
import { ensureStories15M } from "@hybridgen/core";

/** The default model, converted on first use (CI's `npm run setup` has fetched it already). */
export const stories15M = (): Promise<string> => ensureStories15M({});

export const PROMPT = "Once upon a time";
/** llama2.c's greedy continuation starts like this (from its README and run.c output). */
export const STORY_PREFIX =
  "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, she saw a big, red ball in the sky.";

/** stdout of `hybridgen generate --prompt "Once upon a time" --temperature 0 --max-tokens 256`. */
export const greedyStory = (): string =>
  readFileSync(new URL("./fixtures/stories15M-greedy-256.txt", import.meta.url), "utf8");
