/**
 * The figures' one chart type: bars of `y` per `x`, one bar per series side by side, optionally
 * one panel per facet (a model) — as the paper's Figs. 14–21 draw them.
 */
import type { TopLevelSpec } from "vega-lite";

export interface BarDatum {
  readonly x: string | number;
  readonly series: string;
  readonly y: number;
  readonly facet?: string;
}

export interface GroupedBars {
  readonly title: string;
  readonly xTitle: string;
  readonly yTitle: string;
  readonly data: readonly BarDatum[];
  /** Order of the series in the legend and within a group (default: first appearance). */
  readonly seriesOrder?: readonly string[];
  /** A dashed rule at this y (e.g. 1.0 on a normalised axis). */
  readonly rule?: number;
}

export function groupedBarsSpec(c: GroupedBars): TopLevelSpec {
  const order = c.seriesOrder ?? [...new Set(c.data.map((d) => d.series))];
  const xOrder = [...new Set(c.data.map((d) => d.x))].map(String);
  const faceted = c.data.some((d) => d.facet !== undefined);
  const values = c.data.map((d) => ({ ...d, x: String(d.x) }));
  const bars = {
    mark: { type: "bar" as const, tooltip: true },
    encoding: {
      x: { field: "x", type: "nominal" as const, title: c.xTitle, sort: xOrder, axis: { labelAngle: 0 } },
      xOffset: { field: "series", type: "nominal" as const, sort: order },
      y: { field: "y", type: "quantitative" as const, title: c.yTitle },
      color: { field: "series", type: "nominal" as const, title: null, sort: order, scale: { scheme: "tableau20" } },
    },
  };
  const layers = c.rule === undefined ? [bars] : [bars, { mark: { type: "rule" as const, strokeDash: [4, 3], color: "#444" }, encoding: { y: { datum: c.rule } } }];
  const inner = { width: { step: 14 }, height: 220, layer: layers };
  const spec = faceted
    ? { data: { values }, facet: { column: { field: "facet", type: "nominal" as const, title: null } }, spec: inner, resolve: { scale: { y: "independent" as const } } }
    : { data: { values }, ...inner };
  return { $schema: "https://vega.github.io/schema/vega-lite/v6.json", title: c.title, ...spec } as TopLevelSpec;
}
