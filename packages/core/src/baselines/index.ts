export { AoGAttention } from "./aog-attention.js";
export { AoCAttention, offloadedLayerBytes } from "./aoc-attention.js";
export { BaselineAttention } from "./baseline-attention.js";
export { BaselineStats } from "./baseline-stats.js";
