/** A Llama config's bf16 bytes a decode step reads (stories15M's shape itself: core's STORIES15M_SHAPE). */

/**
 * A Llama-family config's sizes and the bf16 bytes a decode step reads: q/k/v/o and
 * gate/up/down of every layer plus one vocab × hidden matrix (the LM head), norms left out;
 * and K+V of one cached token over all layers (the benches' memory floor: bytes ÷ bandwidth).
 */
export function llamaBf16Sizes(json: Record<string, unknown>) {
  const hidden = json.hidden_size as number, layers = json.num_hidden_layers as number, heads = json.num_attention_heads as number;
  const kvHeads = (json.num_key_value_heads as number) ?? heads, inter = json.intermediate_size as number, vocab = json.vocab_size as number;
  const hd = (json.head_dim as number) ?? hidden / heads;
  const weightBytes = 2 * (layers * (hidden * (heads + 2 * kvHeads) * hd + heads * hd * hidden + 3 * hidden * inter) + vocab * hidden);
  const kvBytesPerToken = 2 * layers * 2 * kvHeads * hd;
  return { hidden, layers, heads, kvHeads, inter, vocab, hd, weightBytes, kvBytesPerToken };
}
