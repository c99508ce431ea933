// petting ui: the run list, charts, time line, sampling trees and configs of the runs
// the server reads. Everything comes from /api/*; the page asks again every two seconds
// and redraws a run's views only when its number of commits changed.
"use strict";

const POLL_MS = 2000;
const DASHES = [[], [8, 4], [2, 3], [12, 3, 2, 3]];
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

const state = {
  runs: [],            // from /api/runs
  selected: [],        // urls of the runs shown, in the order they were ticked
  drawnCommits: {},    // url -> commits when its views were last drawn
  panels: null,        // from /api/panels
  edited: {},          // panel id -> the query typed in its box
  plots: {},           // panel id -> uPlot
  tab: "charts",
};

async function api(path, body) {
  const options = body === undefined ? {} : { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) };
  const response = await fetch(path, options);
  const json = await response.json();
  if (!response.ok) throw new Error(json.error || response.statusText);
  return json;
}

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function runName(url) {
  const run = state.runs.find((r) => r.url === url);
  return run ? run.name : url;
}

function humanSeconds(seconds) {
  const s = Math.round(Math.max(0, seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

// ---- the run list -------------------------------------------------------------------

function readHash() {
  const match = location.hash.match(/runs=([^&]*)/);
  return match ? match[1].split(",").filter(Boolean).map(decodeURIComponent) : [];
}

function writeHash() {
  history.replaceState(null, "", `#runs=${state.selected.map(encodeURIComponent).join(",")}&tab=${state.tab}`);
}

function renderRunTable() {
  const body = document.querySelector("#run-table tbody");
  body.replaceChildren();
  for (const run of state.runs) {
    const h = run.headline;
    const box = element("input", { type: "checkbox", class: "pick" });
    box.checked = state.selected.includes(run.url);
    box.addEventListener("change", () => {
      state.selected = box.checked ? [...state.selected, run.url] : state.selected.filter((u) => u !== run.url);
      writeHash();
      redrawAll();
    });
    const row = element("tr", { class: "run" + (run.error ? " error" : ""), "data-url": run.url });
    row.dataset.iterationsDone = h ? h.iterations_done : "";
    row.append(element("td", {}, box), element("td", { title: run.url, text: run.name }));
    if (!h) {
      row.append(element("td", { colspan: "6", text: run.error || "no run.yaml" }));
    } else {
      const last = h.last ? `${h.last.stage} at ${new Date(h.last.finished_at).toLocaleTimeString()}` : "-";
      row.append(
        element("td", { class: "state-" + h.state, text: h.state }),
        element("td", { class: "iterations", text: `${h.iterations_done}/${h.iterations}` }),
        element("td", { text: `${h.stages_done}/${h.stages}` }),
        element("td", { text: last }),
        element("td", { text: h.next || "-" }),
        element("td", { text: h.eta_seconds == null ? "-" : humanSeconds(h.eta_seconds) }),
      );
    }
    body.append(row);
  }
}

async function poll() {
  try {
    state.runs = await api("/api/runs");
    const known = new Set(state.runs.map((r) => r.url));
    state.selected = state.selected.filter((u) => known.has(u));
    if (state.selected.length === 0 && state.runs.length > 0) state.selected = [state.runs[0].url];
    renderRunTable();
    const changed = state.selected.some((url) => state.runs.find((r) => r.url === url).commits !== state.drawnCommits[url]);
    if (changed) await redrawAll();
    document.getElementById("updated").textContent = `read ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    document.getElementById("updated").textContent = `cannot read the stores: ${error.message}`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

async function redrawAll() {
  for (const url of state.selected) state.drawnCommits[url] = (state.runs.find((r) => r.url === url) || {}).commits;
  await Promise.all([drawCharts(), drawTimeline(), fillTreeRuns(), drawComparison(), drawConfigs()]);
  document.body.dataset.redraws = String(Number(document.body.dataset.redraws || 0) + 1);
}

// ---- charts -------------------------------------------------------------------------

function panelQuery(panel) {
  return state.edited[panel.id] ?? panel.query;
}

function panelBox(panel) {
  let box = document.getElementById("panel-" + panel.id);
  if (box) return box;
  const query = element("textarea", { spellcheck: "false" });
  query.value = panel.query;
  const run = element("button", { text: "Run", onclick: () => { state.edited[panel.id] = query.value; drawCharts([panel]); } });
  const reset = element("button", { text: "Reset", onclick: () => { delete state.edited[panel.id]; query.value = panel.query; drawCharts([panel]); } });
  box = element("div", { class: "panel", id: "panel-" + panel.id },
    element("h3", { text: panel.title }),
    element("div", { class: "plot" }),
    element("p", { class: "error" }),
    element("details", {}, element("summary", { text: "SQL" }), query, run, reset));
  document.getElementById("charts").append(box);
  return box;
}

async function drawCharts(only) {
  const panels = only || state.panels.charts;
  const perRun = await Promise.all(state.selected.map(async (url) => {
    const results = await api("/api/series", { run: url, queries: panels.map(panelQuery) }).catch((e) => panels.map(() => ({ error: e.message })));
    return { url, results };
  }));
  panels.forEach((panel, i) => {
    const series = [];
    const errors = [];
    perRun.forEach(({ url, results }, run) => {
      const result = results[i];
      if (result.error) { errors.push(state.selected.length > 1 ? `${runName(url)}: ${result.error}` : result.error); return; }
      for (const s of result.series) {
        const name = state.selected.length > 1 ? `${runName(url)} · ${s.name}` : s.name;
        series.push({ name, key: s.name, run, points: s.points });
      }
    });
    plot(panel, panelBox(panel), series, errors);
  });
}

function plot(panel, box, series, errors) {
  const area = box.querySelector(".plot");
  box.querySelector(".error").textContent = errors.join("\n");
  box.dataset.series = series.map((s) => s.name).join("\n");
  box.dataset.xs = "";
  if (state.plots[panel.id]) { state.plots[panel.id].destroy(); delete state.plots[panel.id]; }
  area.replaceChildren();
  if (series.length === 0) {
    if (errors.length === 0) area.append(element("p", { class: "empty", text: "no data committed yet" }));
    return;
  }
  const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  box.dataset.xs = xs.join(",");
  const data = [xs, ...series.map((s) => {
    const at = new Map(s.points.map((p) => [p[0], p[1]]));
    return xs.map((x) => (at.has(x) ? at.get(x) : null));
  })];
  const keys = [...new Set(series.map((s) => s.key))];
  const y = panel.y_range ? { range: panel.y_range } : {};
  const options = {
    width: Math.max(320, area.clientWidth || 540),
    height: 240,
    scales: { x: { time: false }, y },
    axes: [{ label: panel.x_label }, { label: panel.y_label, size: 60 }],
    // One colour per series name, one dash per run: the same curve of two runs lines up.
    series: [{ label: panel.x_label }, ...series.map((s) => ({
      label: s.name, stroke: COLOURS[keys.indexOf(s.key) % COLOURS.length], dash: DASHES[s.run % DASHES.length],
      width: 1.5, spanGaps: true, points: { show: true, size: 5 },
    }))],
    cursor: { drag: { x: true, y: false } },
  };
  state.plots[panel.id] = new uPlot(options, data, area);
}

// ---- time line ----------------------------------------------------------------------

async function drawTimeline() {
  const section = document.getElementById("timeline");
  const blocks = await Promise.all(state.selected.map(async (url) => {
    const block = element("div", { class: "timeline-run" }, element("h3", { text: runName(url) }));
    try {
      const spans = await api("/api/sql", { run: url, query: state.panels.timeline });
      const overlap = await api("/api/sql", { run: url, query: state.panels.overlap });
      const [beside, total] = overlap.rows[0] || [0, 0];
      block.append(element("p", { text: `Sampling ran beside training for ${beside} s of the run's ${total} s.` }));
      const end = Math.max(1e-9, ...spans.rows.map((r) => r[4]));
      for (const lane of ["sample", "train"]) {
        const row = element("div", { class: "lane" }, element("span", { class: "lane-name", text: lane }));
        for (const [stage, iteration, spanLane, start, stop] of spans.rows) {
          if (spanLane !== lane) continue;
          const label = `${stage}${iteration == null ? "" : " " + iteration}: ${start.toFixed(1)}–${stop.toFixed(1)} s`;
          row.append(element("div", {
            class: "bar stage-" + stage, title: label,
            style: `left:${(100 * start) / end}%;width:${(100 * (stop - start)) / end}%`,
          }));
        }
        block.append(row);
      }
      const scale = element("div", { class: "lane scale" });
      for (const share of [0, 0.25, 0.5, 0.75, 1]) {
        scale.append(element("span", { class: "tick", style: `left:${100 * share}%`, text: `${(share * end).toFixed(1)} s` }));
      }
      block.append(scale, element("div", { class: "stages" }, ...["prepare-data", "rollout", "evaluate", "group", "advantage", "update"]
        .map((stage) => element("span", {}, element("span", { class: "swatch stage-" + stage }), stage))));
    } catch (error) {
      block.append(element("p", { class: "error", text: error.message }));
    }
    return block;
  }));
  section.replaceChildren(...blocks);
}

// ---- sampling trees -----------------------------------------------------------------

function options(select, values, keep) {
  const previous = keep ? select.value : null;
  select.replaceChildren(...values.map(([value, text]) => element("option", { value: String(value), text })));
  if (previous !== null && values.some(([v]) => String(v) === previous)) select.value = previous;
}

async function fillTreeRuns() {
  const select = document.getElementById("tree-run");
  options(select, state.selected.map((u) => [u, runName(u)]), true);
  await fillTreeIterations();
}

async function fillTreeIterations() {
  const run = document.getElementById("tree-run").value;
  if (!run) return;
  const result = await api("/api/sql", { run, query: "SELECT DISTINCT iteration FROM turns ORDER BY iteration" }).catch(() => ({ rows: [] }));
  const select = document.getElementById("tree-iteration");
  const fresh = select.options.length === 0;
  options(select, result.rows.map(([k]) => [k, String(k)]), true);
  if (fresh && select.options.length > 0) select.selectedIndex = select.options.length - 1;
  await fillTreeTasks();
}

async function fillTreeTasks() {
  const run = document.getElementById("tree-run").value;
  const iteration = document.getElementById("tree-iteration").value;
  if (!run || iteration === "") return;
  // The tasks whose rewards spread the most first: their trees carry the update's signal.
  const query = `SELECT t.task_id, max(g.std) AS spread FROM (SELECT DISTINCT task_id FROM turns WHERE iteration = ${Number(iteration)}) t ` +
    `LEFT JOIN groups g ON g.task_id = t.task_id AND g.iteration = ${Number(iteration)} GROUP BY t.task_id ORDER BY spread DESC NULLS LAST, t.task_id LIMIT 100`;
  const result = await api("/api/sql", { run, query }).catch(() => ({ rows: [] }));
  const select = document.getElementById("tree-task");
  options(select, result.rows.map(([task, spread]) => [task, spread == null ? task : `${task} (reward std ${spread.toFixed(3)})`]), true);
  await drawTree();
}

function tokenColour(logprob) {
  const p = Math.exp(logprob);
  return `hsl(${Math.round(120 * p)},75%,82%)`;
}

function signed(x) {
  return x == null ? "—" : (x >= 0 ? "+" : "") + x.toFixed(3);
}

async function drawTree() {
  const view = document.getElementById("tree-view");
  const run = document.getElementById("tree-run").value;
  const iteration = document.getElementById("tree-iteration").value;
  const task = document.getElementById("tree-task").value;
  if (!run || iteration === "" || !task) { view.replaceChildren(element("p", { text: "No rollout is committed yet." })); return; }
  let steps;
  try {
    steps = await api("/api/tree", { run, iteration: Number(iteration), task });
  } catch (error) {
    view.replaceChildren(element("p", { class: "error", text: error.message }));
    return;
  }
  view.replaceChildren(...steps.map((step) => {
    const n = step.candidates.length;
    const box = element("div", { class: "step" },
      element("h4", { text: `episode ${step.episode} · turn ${step.turn} · ${step.agent} · policy ${step.policy} v${step.policy_version} · ${n} candidate${n === 1 ? "" : "s"}` }),
      element("details", {}, element("summary", { text: `prompt (${step.prompt_tokens} tokens)` }), element("pre", { text: step.prompt })));
    for (const c of step.candidates) {
      const stale = c.staleness ? `, ${c.staleness} version${c.staleness === 1 ? "" : "s"} stale` : "";
      const summary = `${c.selected ? "▶" : "\u2003"} b${c.branch}  r ${signed(c.team_reward + c.local_reward)} (team ${signed(c.team_reward)}, local ${signed(c.local_reward)})  A ${signed(c.advantage)}  ${c.tokens.length} tokens, ${c.finish_reason}${c.success ? ", success" : ""}${stale}`;
      const response = element("div", { class: "response" });
      for (const [text, logprob] of c.tokens) {
        response.append(element("span", { class: "tok", style: `background:${tokenColour(logprob)}`, title: `logprob ${logprob.toFixed(3)} · p ${Math.exp(logprob).toFixed(3)}`, "data-logprob": String(logprob), text }));
      }
      const candidate = element("div", { class: "candidate" + (c.selected ? " selected" : "") }, element("div", { class: "summary", text: summary }), response);
      if (c.parse_error) candidate.append(element("div", { class: "feedback", text: `parse error: ${c.parse_error}` }));
      if (c.feedback) candidate.append(element("div", { class: "feedback", text: `feedback: ${c.feedback}` }));
      box.append(candidate);
    }
    return box;
  }));
}

// ---- compare ------------------------------------------------------------------------

// Held-out success per method and task over the ticked runs, as `petting compare` gives
// it: untrained and trained rows, mean ± std over seeds, Δ against the single agent.
async function drawComparison() {
  const section = document.getElementById("compare");
  let cells;
  try {
    cells = await api("/api/compare", { runs: state.selected });
  } catch (error) {
    section.replaceChildren(element("p", { class: "error", text: error.message }));
    return;
  }
  const tasks = [...new Set(cells.map((c) => c.task))];
  const methods = [...new Set(cells.map((c) => c.method))];
  const head = element("tr", {}, element("th", { text: "method" }), ...tasks.map((t) => element("th", { text: t })));
  const rows = methods.map((method) => element("tr", { class: "compare-row" }, element("td", { text: method }), ...tasks.map((task) => {
    const c = cells.find((x) => x.method === method && x.task === task);
    if (!c) return element("td", { text: "" });
    const delta = c.delta_vs_single_agent == null ? "" : ` Δ ${(100 * c.delta_vs_single_agent >= 0 ? "+" : "")}${(100 * c.delta_vs_single_agent).toFixed(1)}`;
    return element("td", {},
      element("div", { class: "meter" }, element("div", { class: "meter-fill", style: `width:${(100 * c.success_mean).toFixed(1)}%` })),
      `${(100 * c.success_mean).toFixed(1)} ± ${(100 * c.success_std).toFixed(1)} (${c.seeds})${delta}`);
  })));
  const few = cells.filter((c) => c.seeds < 2).length;
  section.replaceChildren(
    element("p", { class: "hint", text: "Held-out success (%) of the ticked runs' first and last evaluated versions, mean ± std over seeds (seeds in brackets), Δ against the single agent." + (few ? ` ${few} cells have one seed: their ± is no measured spread.` : "") }),
    element("table", { class: "comparison" }, head, ...rows));
}

// ---- configs ------------------------------------------------------------------------

async function drawConfigs() {
  const blocks = await Promise.all(state.selected.map(async (url) => {
    const block = element("div", { class: "config-run" }, element("h3", { text: runName(url) }));
    try {
      const run = await api("/api/config", { run: url });
      const facts = [
        ["store", run.url],
        ["first stage started", run.first_started_at || "-"],
        ["last commit", run.last_finished_at || "-"],
        ["code versions", run.code_versions.join(", ") || "-"],
        ["forked from", run.fork ? JSON.stringify(run.fork) : "-"],
      ];
      block.append(element("table", {}, ...facts.map(([k, v]) => element("tr", {}, element("th", { text: k }), element("td", { text: v })))));
      block.append(element("pre", { text: run.yaml || "(no run.yaml)" }));
    } catch (error) {
      block.append(element("p", { class: "error", text: error.message }));
    }
    return block;
  }));
  document.getElementById("config").replaceChildren(...blocks);
}

// ---- start --------------------------------------------------------------------------

function showTab(name) {
  state.tab = name;
  for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", button.dataset.tab === name);
  for (const section of document.querySelectorAll("main .tab")) section.hidden = section.id !== name;
  writeHash();
}

async function start() {
  for (const button of document.querySelectorAll("#tabs button")) button.addEventListener("click", () => showTab(button.dataset.tab));
  document.getElementById("tree-run").addEventListener("change", fillTreeIterations);
  document.getElementById("tree-iteration").addEventListener("change", fillTreeTasks);
  document.getElementById("tree-task").addEventListener("change", drawTree);
  state.panels = await api("/api/panels");
  state.selected = readHash();
  const tab = location.hash.match(/tab=(\w+)/);
  if (tab) showTab(tab[1]);
  await poll();
}

start();
