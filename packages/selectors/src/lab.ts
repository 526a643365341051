/** What only the lab's benches reach for (apps/bench): the selectors' input copier. Not part of the package's API; it may change in any release. */
export { InputCopier } from "./input-copy.js";
