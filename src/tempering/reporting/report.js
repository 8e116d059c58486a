// Draws a tempering report from the JSON in #report-data (see tempering/reporting/html.py).
// Plain DOM and SVG, no libraries. Each plot's <svg> carries data-points (points drawn) and
// data-axes, each line its data-key and data-axis, each heat-map's <svg> data-family and
// data-rows, its rows data-domain (in the order drawn), the body data-smoothing (the slider's value;
// #smoothing=W in the address sets it) and data-rendered="1" once everything is drawn, and
// <html> data-errors the page's errors (collected by the script in <head>), so a headless
// browser's dumped DOM shows them all.
"use strict";

const DATA = JSON.parse(document.getElementById("report-data").textContent);
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                "#7f7f7f", "#bcbd22"];
const DASHES = ["", "6 3", "2 2", "8 3 2 3", "1 4"];
const SVG = "http://www.w3.org/2000/svg";
const W = 460, H = 240, M = {left: 64, right: 12, top: 10, bottom: 28}, RIGHT_AXIS = 64;

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  for (const child of children) node.append(child);
  return node;
}

function fmt(value) {
  if (value === null || value === undefined) return "n/a";
  if (typeof value !== "number") return String(value);
  const size = Math.abs(value);
  return size !== 0 && (size >= 1e5 || size < 1e-3) ? value.toExponential(2) : String(+value.toPrecision(4));
}

// Axis ticks at round numbers: a step of 1, 2 or 5 times a power of ten, the axis widened to
// whole steps, so that the labels read 0.2, 0.4, 0.6 and not 0.1812, 0.3624.
function niceScale(low, high, count, whole) {
  if (low === high && low === 0) high = 1;  // a series of zeros: the usual 0 to 1
  else if (low === high) { const pad = Math.abs(low) * 0.1; low -= pad; high += pad; }
  const raw = (high - low) / (count - 1), power = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 5, 10].find(unit => unit * power >= raw * (1 - 1e-9)) * power;
  if (whole) step = Math.max(1, Math.round(step));
  const start = Math.floor(low / step + 1e-9) * step, end = Math.ceil(high / step - 1e-9) * step;
  const ticks = [];
  for (let i = 0; start + i * step <= end + step * 1e-6; i++) ticks.push(start + i * step);
  return {low: start, high: end === start ? start + step : end, step, ticks};
}

function tickLabel(value, step) {
  if (Math.abs(value) < step * 1e-6) return "0";
  const size = Math.abs(value);
  if (size >= 1e5 || size < 1e-3) return Number(value.toPrecision(6)).toExponential();
  return value.toFixed(Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
}

// TensorBoard's smoothing: an exponential moving average, debiased so the first points are
// not pulled towards 0.
function smooth(points, weight) {
  let last = 0;
  return points.map(([x, y], i) => {
    last = last * weight + (1 - weight) * y;
    return [x, weight ? last / (1 - Math.pow(weight, i + 1)) : y];
  });
}

function seriesStyle(series, panel) {
  if (panel.x) {  // against length: one run, a line per evaluation, dark (first) to light (last)
    const index = panel.series.indexOf(series), last = Math.max(1, panel.series.length - 1);
    return {color: colour(SEQUENTIAL, 0.85 * index / last), dash: "", label: series.key};
  }
  const many = DATA.runs.length > 1;
  const sameRun = panel.series.filter(s => s.run === series.run);
  const index = many ? sameRun.indexOf(series) : panel.series.indexOf(series);
  const label = many ? `${DATA.runs[series.run].name} · ${series.key}` : series.key;
  return {color: COLORS[(many ? series.run : index) % COLORS.length],
          dash: many ? DASHES[index % DASHES.length] : "",
          label: series.axis ? label + " (right)" : label};
}

function px(coordinate) {
  return String(Math.round(coordinate * 10) / 10);  // a tenth of a pixel is as fine as a screen shows
}

function drawAxis(svg, scale, toY, margin, right) {
  for (const y of scale.ticks) {
    if (!right) svg.append(el("svg:line", {x1: margin.left, x2: W - margin.right, y1: toY(y), y2: toY(y), class: "grid"}));
    svg.append(el("svg:text", {x: right ? W - margin.right + 4 : margin.left - 4, y: toY(y) + 4,
                               "text-anchor": right ? "start" : "end", class: "tick"}, tickLabel(y, scale.step)));
  }
  const x = right ? W - margin.right : margin.left;
  svg.append(el("svg:line", {x1: x, x2: x, y1: M.top, y2: H - M.bottom, class: "axis"}));
}

// A plot over steps, or with panel.x (the unit of its x axis) over something else, unsmoothed.
function drawPlot(panel, smoothing) {
  const weight = panel.x ? 0 : smoothing;
  const margin = {...M, right: panel.axes > 1 ? RIGHT_AXIS : M.right};
  const drawnOf = s => s.points.filter(p => p[1] !== null);
  const points = panel.series.flatMap(drawnOf);
  const xs = niceScale(Math.min(...points.map(p => p[0])), Math.max(...points.map(p => p[0])), 6, true);
  const sx = x => margin.left + (x - xs.low) / (xs.high - xs.low) * (W - margin.left - margin.right);
  const svg = el("svg:svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "plot",
                             "data-title": panel.title, "data-points": points.length, "data-axes": panel.axes});
  const toY = [];
  for (let axis = 0; axis < panel.axes; axis++) {
    const values = panel.series.filter(s => s.axis === axis).flatMap(s => drawnOf(s).map(p => p[1]));
    const scale = niceScale(Math.min(...values), Math.max(...values), 5, false);
    toY.push(y => H - M.bottom - (y - scale.low) / (scale.high - scale.low) * (H - M.top - M.bottom));
    drawAxis(svg, scale, toY[axis], margin, axis === 1);
  }
  for (const x of xs.ticks) {
    svg.append(el("svg:text", {x: sx(x), y: H - 8, "text-anchor": "middle", class: panel.x ? "tick x" : "tick step"},
                               tickLabel(x, xs.step)));
  }
  svg.append(el("svg:line", {x1: M.left, x2: W - margin.right, y1: H - M.bottom, y2: H - M.bottom, class: "axis"}));
  if (panel.x) svg.append(el("svg:text", {x: W - margin.right, y: H - M.bottom - 4, "text-anchor": "end",
                                          class: "tick unit"}, panel.x));
  const legend = el("div", {class: "legend"});
  for (const series of panel.series) {
    const style = seriesStyle(series, panel), sy = toY[series.axis];
    const drawn = drawnOf(series), smoothed = smooth(drawn, weight);
    const line = (pts, kind) => el("svg:polyline", {points: pts.map(p => `${px(sx(p[0]))},${px(sy(p[1]))}`).join(" "),
      fill: "none", stroke: style.color, "stroke-dasharray": style.dash, "stroke-width": 1.5, class: kind,
      "data-key": series.key, "data-axis": series.axis});
    if (weight) svg.append(line(drawn, "raw faint"));
    svg.append(line(smoothed, weight ? "smoothed" : "raw"));
    drawn.forEach(([x, y], i) => svg.append(el("svg:circle", {cx: sx(x), cy: sy(y), r: 2.5, fill: style.color},
      el("svg:title", {}, `${style.label}\n${panel.x ? `${x} ${panel.x}` : `step ${x}`}: ${fmt(y)}` +
                         (weight ? ` (smoothed ${fmt(smoothed[i][1])})` : "")))));
    const swatch = el("svg:svg", {width: 22, height: 8},
                      el("svg:line", {x1: 0, x2: 22, y1: 4, y2: 4, stroke: style.color, "stroke-width": 2,
                                      "stroke-dasharray": style.dash}));
    legend.append(el("span", {}, swatch, " " + style.label));
  }
  return el("figure", {}, el("figcaption", {}, el("b", {}, panel.title), panel.note ? " · " + panel.note : ""),
            svg, legend);
}

function drawPlots(weight) {
  const plots = document.getElementById("plots");
  plots.replaceChildren(...DATA.panels.map(panel => drawPlot(panel, weight)));
  document.getElementById("smoothing-value").textContent = weight.toFixed(2);
  document.body.dataset.smoothing = String(weight);
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "n/a";
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function drawHeader(table) {
  table.append(el("tr", {}, ...["run", "model", "algorithm", "steps", "wall time", "held-out accuracy"]
    .map(name => el("th", {}, name))));
  for (const h of DATA.header) {
    const steps = h.planned !== null && h.planned !== undefined && h.planned !== h.steps ? `${h.steps} of ${h.planned}`
                                                                                         : String(h.steps);
    const accuracy = h.before === null && h.after === null ? (h.finished ? "n/a" : "not finished")
                                                           : `${fmt(h.before)} → ${fmt(h.after)}`;
    table.append(el("tr", {}, el("td", {}, h.name), el("td", {class: "model"}, h.model || "n/a"),
                    el("td", {}, h.algorithm || "n/a"), el("td", {}, steps),
                    el("td", {}, duration(h.wall_s) + (h.finished ? "" : " so far")), el("td", {}, accuracy)));
  }
}

function initialSmoothing() {
  const found = /smoothing=([0-9.]+)/.exec(location.hash);
  return found ? Math.min(0.99, Math.max(0, Number(found[1]))) : 0.6;
}

function promptText(prompt) {
  return Array.isArray(prompt) ? prompt.map(m => `[${m.role}] ${m.content}`).join("\n") : String(prompt);
}

function partsTable(parts) {
  const table = el("table", {class: "parts"});
  for (const [name, value] of Object.entries(parts || {})) table.append(el("tr", {}, el("td", {}, name),
                                                                                 el("td", {}, fmt(value))));
  return table;
}

function turnView(turn, index) {
  const box = el("div", {class: "turn"},
                 el("div", {class: "label"}, `model turn ${index + 1} · ${turn.finish_reason}`),
                 el("pre", {}, turn.text));
  if (turn.observation !== null && turn.observation !== undefined) {
    box.append(el("div", {class: "label"}, "environment"), el("pre", {class: "observation"},
                                                             promptText(turn.observation)));
  }
  const extra = {...turn.rewards, ...turn.info};
  if (Object.keys(extra).length) box.append(partsTable(extra));
  return box;
}

function sampleView(sample, kind) {
  const head = `${kind} · reward ${fmt(sample.reward)} · step ${sample.step} · ${sample.task} · ` +
               `${sample.finish_reason} · ${sample.completion_tokens} tokens · policy v${sample.policy_version}`;
  const body = el("div", {class: "body"}, el("div", {class: "label"}, "prompt"), el("pre", {}, promptText(sample.prompt)));
  if (sample.turns) sample.turns.forEach((turn, i) => body.append(turnView(turn, i)));
  else body.append(el("div", {class: "label"}, "completion"), el("pre", {}, sample.completion));
  body.append(el("div", {class: "label"}, `reference answer: ${sample.answer}`), partsTable(sample.reward_parts));
  return el("details", {class: "sample", "data-kind": kind}, el("summary", {}, head), body);
}

function drawBrowser(root) {
  if (!DATA.samples.length) root.append(el("p", {}, "No samples.jsonl in these runs (logging.samples is 0)."));
  for (const entry of DATA.samples) {
    const section = el("section", {class: "domain"},
                       el("h3", {}, `${DATA.runs[entry.run].name} · ${entry.domain} (${entry.count} samples)`));
    for (const kind of ["best", "worst", "random"]) entry[kind].forEach(s => section.append(sampleView(s, kind)));
    root.append(section);
  }
}

function percent(value) {
  return value === null || value === undefined ? "n/a" : `${(100 * value).toFixed(1)}%`;
}

// Held-out accuracy per task, first and last measured, as html.py's heldout() ordered them
// (most dropped first); the mean row from summary.json where the run finished.
function drawHeldout(root) {
  DATA.heldout.forEach((rows, run) => {
    if (!rows.length) return;
    const table = el("table", {class: "heldout", "data-run": run},
                     el("tr", {}, ...[DATA.runs[run].name, "first", "last", "change"].map(h => el("th", {}, h))));
    const line = (task, first, firstAt, last, lastAt, change) => el("tr", {"data-task": task}, el("td", {}, task),
      el("td", {}, `${percent(first)} (${firstAt})`), el("td", {}, `${percent(last)} (${lastAt})`),
      el("td", {class: change < 0 ? "down" : change > 0 ? "up" : ""},
         change === null ? "n/a" : `${change >= 0 ? "+" : ""}${(100 * change).toFixed(1)}`));
    for (const r of rows) table.append(line(r.task, r.first, r.first_at, r.last, r.last_at, r.change));
    const s = DATA.runs[run].summary;
    if (s && s.eval_before && s.eval_after && s.eval_before.accuracy !== null && s.eval_after.accuracy !== null) {
      table.append(line("mean", s.eval_before.accuracy, "before", s.eval_after.accuracy, "after",
                        s.eval_after.accuracy - s.eval_before.accuracy));
    }
    root.append(table);
  });
  if (!root.children.length) root.append(el("p", {}, "No held-out evaluation in these runs."));
}

// Colour maps as stops, interpolated: viridis (low dark, high bright; even in lightness, so the
// weakest cells read as the darkest in print too) and a red-white-blue one for changes.
const SEQUENTIAL = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const DIVERGING = [[178, 24, 43], [239, 138, 98], [247, 247, 247], [103, 169, 207], [33, 102, 172]];
const ROW_H = 12, HEAT_W = 520, NAME_CHARS = 30;

function colour(stops, t) {
  const at = Math.min(1, Math.max(0, t)) * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(at));
  return `rgb(${stops[i].map((c, k) => Math.round(c + (stops[i + 1][k] - c) * (at - i))).join(",")})`;
}

function columnLabel(map, column) {
  if (map.axis !== "step") return map.axis === "depth" ? `evidence at ${column}` : column;
  return column[0] === column[1] ? `step ${column[0]}` : `steps ${column[0]}-${column[1]}`;
}

function colourBar(svg, scale, stops, x, y) {
  const width = 200, parts = 50;
  for (let i = 0; i < parts; i++) {
    svg.append(el("svg:rect", {x: x + i * width / parts, y, width: width / parts + 0.5, height: 8,
                               fill: colour(stops, (i + 0.5) / parts)}));
  }
  for (const value of scale.ticks) {
    const at = x + (value - scale.low) / (scale.high - scale.low) * width;
    svg.append(el("svg:text", {x: at, y: y + 19, "text-anchor": "middle", class: "tick scale"},
                  tickLabel(value, scale.step)));
  }
}

// One heat-map: a row per domain (in html.py's order, weakest first), a column per group of
// steps (or per run, or per depth bin: a row per length then), each cell's value in its
// title, each row's last value (mean, or accuracy over all depths) at its right end and the
// colour scale under it. Each row is a <g class="row" data-domain=...>.
function drawHeatmap(map) {
  const n = map.columns.length, rows = map.rows.length, labelled = map.axis !== "step";
  const end = {run: "mean", depth: "all"}[map.axis] || "last";
  const label = 8 + 6 * Math.min(NAME_CHARS, Math.max(4, ...map.rows.map(r => r.length)));
  const cell = labelled ? 56 : Math.max(2, Math.min(40, HEAT_W / n));
  const top = labelled ? 64 : 14, bottom = top + rows * ROW_H;
  const width = label + Math.max(n * cell + 60, 224), height = bottom + 48;
  const scale = niceScale(map.low, map.high, 5, false);
  const stops = map.palette === "diverging" ? DIVERGING : SEQUENTIAL;
  const svg = el("svg:svg", {viewBox: `0 0 ${width} ${height}`, width, height, class: "heatmap",
                             "data-title": map.title, "data-family": map.family,
                             "data-run": map.run === null ? "all" : map.run, "data-rows": rows, "data-columns": n});
  svg.append(el("svg:text", {x: label + n * cell + 4, y: top - 3, class: "tick"}, end));
  map.rows.forEach((domain, r) => {
    const y = top + r * ROW_H, last = map.last[r];
    const row = el("svg:g", {class: "row", "data-domain": domain, "data-last": last === null ? "" : last});
    const name = domain.length > NAME_CHARS ? domain.slice(0, NAME_CHARS - 1) + "…" : domain;
    row.append(el("svg:text", {x: label - 4, y: y + ROW_H - 2, "text-anchor": "end", class: "name"}, name,
                  el("svg:title", {}, domain)));
    map.cells[r].forEach((value, c) => row.append(el("svg:rect", {
      x: px(label + c * cell), y, width: px(cell), height: ROW_H - 1,
      fill: value === null ? "#f2f2f2" : colour(stops, (value - scale.low) / (scale.high - scale.low))},
      el("svg:title", {}, `${domain}\n${columnLabel(map, map.columns[c])}: ${fmt(value)}`))));
    row.append(el("svg:text", {x: label + n * cell + 4, y: y + ROW_H - 2, class: "last"}, fmt(last)));
    svg.append(row);
  });
  if (labelled) {
    map.columns.forEach((name, c) => svg.append(el("svg:text", {
      transform: `translate(${px(label + (c + 0.5) * cell)},${top - 4}) rotate(-35)`, class: `tick ${map.axis}`}, name)));
  } else {
    const steps = niceScale(map.columns[0][0], map.columns[n - 1][1], Math.max(2, Math.min(n, 6)), true);
    for (const step of steps.ticks) {
      const c = map.columns.findIndex(column => column[0] <= step && step <= column[1]);
      if (c < 0) continue;  // between two logged steps, or past the last
      svg.append(el("svg:text", {x: px(label + (c + 0.5) * cell), y: bottom + 12, "text-anchor": "middle",
                                 class: "tick step"}, String(step)));
    }
  }
  colourBar(svg, scale, stops, label, bottom + 24);
  const run = map.run !== null && DATA.runs.length > 1 ? ` · ${DATA.runs[map.run].name}` : "";
  return el("figure", {class: "wide"}, el("figcaption", {}, el("b", {}, map.title + run),
            ` · ${map.note} · rows: ${map.order}; hover a cell for its value`), svg);
}

function draw() {
  DATA.runs.forEach((run, i) => document.getElementById("runs").append(
    el("span", {class: "run", style: `border-color: ${COLORS[i % COLORS.length]}`}, `${run.name} `,
       el("small", {}, run.path))));
  drawHeader(document.getElementById("header"));
  const slider = document.getElementById("smoothing");
  slider.value = String(initialSmoothing());
  slider.addEventListener("input", () => drawPlots(Number(slider.value)));
  drawPlots(Number(slider.value));
  const alerts = document.getElementById("alerts");
  alerts.append(DATA.alerts.length ? el("ul", {}, ...DATA.alerts.map(a => el("li", {},
    `${DATA.runs[a.run].name} · step ${a.step}: ${a.monitor} = ${fmt(a.value)}`))) : el("p", {}, "none"));
  document.getElementById("heatmaps").replaceChildren(...DATA.heatmaps.map(drawHeatmap));
  if (!DATA.heatmaps.length) document.getElementById("heatmaps").append(el("p", {},
    "none: no metric has more than six domains, and no shares were logged (lines in the plots above)"));
  drawHeldout(document.getElementById("summary"));
  drawBrowser(document.getElementById("browser"));
  for (const run of DATA.runs) {
    document.getElementById("config").append(el("details", {}, el("summary", {}, run.name),
                                                 el("pre", {}, run.config || "(no config.yaml)")));
  }
}

try {
  draw();
  document.body.dataset.rendered = "1";
} catch (error) {
  window.reportError(error && error.stack || error);
}
