// Draws a tempering report from the JSON in #report-data (see tempering/reporting/html.py).
// Plain DOM and SVG, no libraries. Each plot's <svg> carries data-points (points drawn), the
// body data-rendered="1" once everything is drawn, and <html> data-errors the page's errors
// (collected by the script in <head>), so a headless browser's dumped DOM shows all three.
"use strict";

const DATA = JSON.parse(document.getElementById("report-data").textContent);
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
                "#7f7f7f", "#bcbd22"];
const DASHES = ["", "6 3", "2 2", "8 3 2 3", "1 4"];
const SVG = "http://www.w3.org/2000/svg";
const W = 460, H = 240, M = {left: 56, right: 12, top: 10, bottom: 28};

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

function ticks(low, high, count) {
  if (low === high) return [low];
  const step = (high - low) / (count - 1);
  return Array.from({length: count}, (_, i) => low + i * step);
}

function extent(values) {
  let low = Math.min(...values), high = Math.max(...values);
  if (low === high) { low -= Math.abs(low) * 0.1 || 1; high += Math.abs(high) * 0.1 || 1; }
  return [low, high];
}

function seriesStyle(series, panel) {
  const many = DATA.runs.length > 1;
  const sameRun = panel.series.filter(s => s.run === series.run);
  const index = many ? sameRun.indexOf(series) : panel.series.indexOf(series);
  return {color: COLORS[(many ? series.run : index) % COLORS.length],
          dash: many ? DASHES[index % DASHES.length] : "",
          label: many ? `${DATA.runs[series.run].name} · ${series.key}` : series.key};
}

function drawPlot(panel) {
  const points = panel.series.flatMap(s => s.points.filter(p => p[1] !== null));
  const [x0, x1] = extent(points.map(p => p[0]));
  const [y0, y1] = extent(points.map(p => p[1]));
  const sx = x => M.left + (x - x0) / (x1 - x0) * (W - M.left - M.right);
  const sy = y => H - M.bottom - (y - y0) / (y1 - y0) * (H - M.top - M.bottom);
  const svg = el("svg:svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "plot",
                             "data-title": panel.title, "data-points": points.length});
  for (const y of ticks(y0, y1, 5)) {
    svg.append(el("svg:line", {x1: M.left, x2: W - M.right, y1: sy(y), y2: sy(y), class: "grid"}));
    svg.append(el("svg:text", {x: M.left - 4, y: sy(y) + 4, "text-anchor": "end"}, fmt(y)));
  }
  for (const x of ticks(x0, x1, Math.min(6, new Set(points.map(p => p[0])).size))) {
    svg.append(el("svg:text", {x: sx(x), y: H - 8, "text-anchor": "middle"}, fmt(Math.round(x * 100) / 100)));
  }
  svg.append(el("svg:line", {x1: M.left, x2: M.left, y1: M.top, y2: H - M.bottom, class: "axis"}));
  svg.append(el("svg:line", {x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom, class: "axis"}));
  const legend = el("div", {class: "legend"});
  for (const series of panel.series) {
    const style = seriesStyle(series, panel);
    const drawn = series.points.filter(p => p[1] !== null);
    svg.append(el("svg:polyline", {points: drawn.map(p => `${sx(p[0])},${sy(p[1])}`).join(" "), fill: "none",
                                   stroke: style.color, "stroke-dasharray": style.dash, "stroke-width": 1.5}));
    for (const [x, y] of drawn) {
      svg.append(el("svg:circle", {cx: sx(x), cy: sy(y), r: 2.5, fill: style.color},
                    el("svg:title", {}, `${style.label}\nstep ${x}: ${fmt(y)}`)));
    }
    const swatch = el("svg:svg", {width: 22, height: 8},
                      el("svg:line", {x1: 0, x2: 22, y1: 4, y2: 4, stroke: style.color, "stroke-width": 2,
                                      "stroke-dasharray": style.dash}));
    legend.append(el("span", {}, swatch, " " + style.label));
  }
  return el("figure", {}, el("figcaption", {}, el("b", {}, panel.title), panel.note ? " · " + panel.note : ""),
            svg, legend);
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

function drawSummary(root) {
  for (const run of DATA.runs) {
    const s = run.summary;
    if (!s || !s.eval_before || !s.eval_after) continue;
    const table = el("table", {}, el("tr", {}, el("th", {}, run.name), el("th", {}, "before"), el("th", {}, "after")));
    for (const task of Object.keys(s.eval_before.per_task)) {
      table.append(el("tr", {}, el("td", {}, task), el("td", {}, fmt(s.eval_before.per_task[task])),
                      el("td", {}, fmt(s.eval_after.per_task[task]))));
    }
    table.append(el("tr", {}, el("td", {}, "mean"), el("td", {}, fmt(s.eval_before.accuracy)),
                    el("td", {}, fmt(s.eval_after.accuracy))));
    root.append(table);
  }
  if (!root.children.length) root.append(el("p", {}, "No finished run (summary.json) among these."));
}

function draw() {
  DATA.runs.forEach((run, i) => document.getElementById("runs").append(
    el("span", {class: "run", style: `border-color: ${COLORS[i % COLORS.length]}`}, `${run.name} `,
       el("small", {}, run.path))));
  const plots = document.getElementById("plots");
  DATA.panels.forEach(panel => plots.append(drawPlot(panel)));
  const alerts = document.getElementById("alerts");
  alerts.append(DATA.alerts.length ? el("ul", {}, ...DATA.alerts.map(a => el("li", {},
    `${DATA.runs[a.run].name} · step ${a.step}: ${a.monitor} = ${fmt(a.value)}`))) : el("p", {}, "none"));
  drawSummary(document.getElementById("summary"));
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
