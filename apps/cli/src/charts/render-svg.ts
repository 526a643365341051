/** A Vega-Lite spec rendered to SVG text headlessly (vega's SVG string renderer, no canvas). */
import { parse, View } from "vega";
import { compile, type TopLevelSpec } from "vega-lite";

export async function renderSvg(spec: TopLevelSpec): Promise<string> {
  const view = new View(parse(compile(spec).spec), { renderer: "none" });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}
