/** Texts and chats whose ids / rendered prompts the reference tokenizers produced. */
export const TOKENIZER_STRINGS: readonly string[] = [
  "Hello world",
  "Once upon a time, there was a little girl named Lily.",
  "  leading spaces and trailing  ",
  "line one\nline two\r\n\ttabbed\n\n",
  "numbers 1234567 and 3.14159, dates 2024-05-01",
  "naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 中文",
  "emoji 🦙🚀👩‍💻 and symbols ∑∫√ ≠ ≤",
  "code: def f(x):\n    return x**2  # square",
  "don't won't it's we'll I'm they've",
  "<|im_start|>user\nhi<|im_end|>",
  "<|endoftext|> after the end",
];

export const CHAT_CASES: readonly { messages: { role: "system" | "user" | "assistant"; content: string }[] }[] = [
  { messages: [{ role: "user", content: "Write a haiku about llamas." }] },
  { messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "What is 2+2?" }, { role: "assistant", content: "4" }, { role: "user", content: "And 3+3?" }] },
];
