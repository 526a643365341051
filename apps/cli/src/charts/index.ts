export { renderSvg } from "./render-svg.js";
export { groupedBarsSpec, type BarDatum, type GroupedBars } from "./grouped-bars.js";
