/** What only the lab's benches reach for (apps/bench): the raw tier entry points. Not part of the package's API; it may change in any release. */
export { tierNative, type TierNative } from "./tier-native.js";
