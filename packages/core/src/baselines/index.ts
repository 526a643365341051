export { AoGAttention } from "./aog-attention.js";
export { AoCAttention, offloadedLayerBytes } from "./aoc-attention.js";
export { BaselineStats } from "./baseline-stats.js";
