// dlx view: draws the payload dlx.view.payload builds. Embedded (--out) or fetched from data.json (the server), then
// fetched again every refresh_s seconds. Every chart overlays the runs on the chosen x axis (step, tokens, wall-clock);
// a downsampled series is its min/max envelope (two lines and the band between them), so no spike is lost.
(function () {
  "use strict";
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22"];
  const EVENT_COLORS = { start: "#2ca02c", resume: "#2ca02c", checkpoint: "#c8c8c8", loss_spike: "#d62728",
    rollback: "#d62728", non_finite_loss: "#ff7f0e", stopped: "#000000", stage: "#9467bd", source_epoch: "#17becf",
    init_from: "#8c564b" };
  const AXIS_NAMES = { step: "step", tokens: "tokens", time: "wall-clock" };
  // what a test or benchmark reads: charts drawn, when the first render ended and was painted, each run's last step
  const view = { drawn: 0, charts: 0, renders: 0, readyMs: null, paintMs: null, lastSteps: {}, plots: [] };
  window.dlxView = view;
  let payloadText = null;
  let charts = [];
  let axis = "step";
  let zoom = null;  // the x range dragged on any chart: every chart shows it, and keeps it across refreshes

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "style") node.style.cssText = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    for (const child of children || []) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    return node;
  }
  const color = (i) => COLORS[i % COLORS.length];
  function num(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "n/a";
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return v.toLocaleString("en-US", { maximumFractionDigits: digits === undefined ? 4 : digits });
  }
  const pct = (v) => (v === null || v === undefined ? "n/a" : (100 * v).toFixed(1) + " %");
  function si(v) {
    const a = Math.abs(v);
    for (const [d, s] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "k"]]) if (a >= d) return +(v / d).toFixed(2) + s;
    return String(+v.toFixed(3));
  }
  function duration(s) {
    if (s === null || s === undefined) return "n/a";
    const a = Math.abs(s);
    if (a >= 86400) return +(s / 86400).toFixed(2) + " d";
    if (a >= 3600) return +(s / 3600).toFixed(2) + " h";
    if (a >= 60) return +(s / 60).toFixed(2) + " min";
    return +s.toFixed(2) + " s";
  }

  // ---- series of one run on the chosen axis -------------------------------------------------------------------
  function table(xs, envelope, scale, breaks) {
    // [x, lo, hi] or [x, v], x strictly increasing (a repeated x keeps its first value); a null point before each
    // break (a restart), so the line does not join two processes across the time between them
    const breakAt = new Set(breaks || []), columns = envelope.v ? [envelope.v] : [envelope.lo, envelope.hi];
    const out = [[], ...columns.map(() => [])];
    let last = -Infinity;
    for (let i = 0; i < xs.length; i++) {
      if (xs[i] === null || xs[i] <= last) continue;
      if (breakAt.has(i) && out[0].length) {
        out[0].push((last + xs[i]) / 2);
        columns.forEach((_, c) => out[c + 1].push(null));
      }
      out[0].push(xs[i]);
      columns.forEach((col, c) => out[c + 1].push(col[i] === null ? null : col[i] * scale));
      last = xs[i];
    }
    return out;
  }

  function chartParts(payload, spec) {
    // one table per run and part that has data, with the uPlot series for its columns
    const tables = [], series = [], bands = [];
    let column = 1;
    payload.runs.forEach((run, i) => {
      for (const part of spec.parts) {
        const source = part.from === "train" ? { x: run.x, series: run.series } : run[part.from];
        const keys = part.prefix ? Object.keys(source.series).filter((k) => k.startsWith(part.prefix))
          : [part.key].filter((k) => source.series[k]);
        keys.forEach((key, j) => {
          const t = table(source.x[axis], source.series[key], part.scale || 1, part.from === "train" ? run.breaks : []);
          if (!t[0].length) return;
          tables.push(t);
          const label = run.name + (part.prefix ? " " + key.slice(part.prefix.length) : part.label ? " " + part.label : "");
          const dash = part.dash ? [6, 3] : undefined;
          const stroke = part.prefix ? shade(color(i), j) : color(i);
          const points = { show: part.from !== "train", size: 4 };
          if (t.length === 2) {
            series.push({ label, stroke, width: 1.5, dash, points });
          } else {
            series.push({ label: label + " min", stroke, width: 1, dash, points: { show: false } });
            series.push({ label: label + " max", stroke, width: 1, dash, points: { show: false } });
            bands.push({ series: [column + 1, column], fill: stroke + "40" });
          }
          column += t.length - 1;
        });
      }
    });
    return { tables, series, bands };
  }

  function shade(hex, j) {
    const n = parseInt(hex.slice(1), 16), f = [1, 0.7, 1.3, 0.5, 1.5][j % 5];
    const c = [(n >> 16) & 255, (n >> 8) & 255, n & 255].map((v) => Math.max(0, Math.min(255, Math.round(v * f))));
    return "#" + c.map((v) => v.toString(16).padStart(2, "0")).join("");
  }

  // ---- charts -------------------------------------------------------------------------------------------------
  function chartSpecs(payload) {
    const specs = [
      { title: "loss (nats/token): train, validation dashed", parts: [{ from: "train", key: "loss" },
        { from: "evals", key: "loss", label: "val", dash: true }] },
      { title: "validation bits per byte", parts: [{ from: "evals", key: "bpb" }, { from: "evals", prefix: "source_bpb/", dash: true }] },
      { title: "validation loss per source", parts: [{ from: "evals", prefix: "source_loss/" }] },
      { title: "learning rate", parts: [{ from: "train", key: "lr" }] },
      { title: "gradient norm", parts: [{ from: "train", key: "grad_norm" }] },
      { title: "tokens/s (all devices)", parts: [{ from: "train", key: "tokens_per_s" }] },
      { title: "MFU % (attention convention)", parts: [{ from: "train", key: "mfu", scale: 100 }] },
      { title: "step time (s)", parts: [{ from: "train", key: "step_s" }] },
      { title: "z-loss", parts: [{ from: "train", key: "z_loss" }] },
    ];
    const taskKeys = new Set();
    payload.runs.forEach((run) => Object.keys(run.tasks.series).forEach((k) => taskKeys.add(k)));
    [...taskKeys].sort().forEach((k) => specs.push({ title: "task " + k, parts: [{ from: "tasks", key: k }] }));
    return specs;
  }

  function eventsPlugin(payload) {
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
          ctx.save();
          ctx.lineWidth = 1;
          for (const run of payload.runs) {
            for (const e of run.events) {
              const x = e.x[axis];
              if (x === null || x === undefined) continue;
              const px = u.valToPos(x, "x", true);
              if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
              ctx.strokeStyle = EVENT_COLORS[e.event] || "#999";
              ctx.setLineDash(e.event === "checkpoint" ? [2, 3] : []);
              ctx.beginPath(); ctx.moveTo(px, top); ctx.lineTo(px, top + height); ctx.stroke();
            }
          }
          ctx.restore();
          view.drawn += 1;
        }],
      },
    };
  }

  function yValues(u, splits) {
    return splits.map((v) => (v === 0 ? "0" : Math.abs(v) < 1e-2 || Math.abs(v) >= 1e6 ? v.toExponential(1)
      : String(+v.toPrecision(4))));
  }

  function zoomAll(u) {
    if (u.select.width < 5) return;
    zoom = { min: u.posToVal(u.select.left, "x"), max: u.posToVal(u.select.left + u.select.width, "x") };
    for (const c of charts) if (c !== u && c.series[0].label === u.series[0].label) c.setScale("x", zoom);
  }

  function axisValues(u, splits) {
    if (axis === "time") return splits.map(duration);
    return splits.map((v) => (Math.abs(v) >= 1e4 ? si(v) : String(+v.toFixed(6))));
  }

  function drawCharts(payload, box) {
    for (const spec of chartSpecs(payload)) {
      const parts = chartParts(payload, spec);
      if (!parts.tables.length) continue;
      // nulls in a table are gaps (a restart, a NaN); the alignment's fillers are skipped over
      const data = parts.tables.length === 1 ? parts.tables[0]
        : uPlot.join(parts.tables, parts.tables.map((t) => t.map(() => 1)));
      const holder = el("div", { class: "chart", "data-title": spec.title }, [el("h3", { text: spec.title })]);
      box.append(holder);
      const options = {
        width: Math.max(300, holder.clientWidth - 14), height: 240, series: [{ label: AXIS_NAMES[axis], value: (u, v) => (v === null ? "" : axisValues(u, [v])[0]) },
          ...parts.series],
        bands: parts.bands, scales: { x: { time: false } }, legend: { show: payload.runs.length <= 4 },
        axes: [{ values: axisValues }, { size: 60, values: yValues }], plugins: [eventsPlugin(payload)],
        cursor: { drag: { x: true, y: false } }, hooks: { setSelect: [zoomAll] },
      };
      const chart = new uPlot(options, data, holder);
      if (zoom) chart.setScale("x", zoom);
      holder.addEventListener("dblclick", () => { zoom = null; render(JSON.parse(payloadText)); });
      charts.push(chart);
    }
  }

  // ---- tables -------------------------------------------------------------------------------------------------
  function tableOf(head, rows) {
    return el("table", {}, [el("tr", {}, head.map((h, i) => el("th", { class: i ? "" : "text", text: h }))),
      ...rows.map((r) => el("tr", {}, r.map((c) => (c instanceof Node ? el("td", {}, [c]) : el("td", { text: c })))))]);
  }
  const swatch = (i) => el("span", { class: "swatch", style: "background:" + color(i) });

  function runsTable(payload, box) {
    box.append(el("h2", { text: "Runs" }));
    const rows = payload.runs.map((run, i) => {
      view.lastSteps[run.name] = run.status.last_step;
      const name = el("span", { "data-run": run.name, "data-last-step": String(run.status.last_step) },
        [swatch(i), run.name]);
      const state = !run.status.has_metrics ? "no step logged yet" : run.status.finished ? "finished" : "running or stopped";
      const g = run.goodput.goodput;
      return [name, run.where, state, String(run.status.records), run.status.last_step === null ? "" : String(run.status.last_step),
        num(run.status.last_loss), g === undefined || g === null ? "n/a" : pct(g)];
    });
    box.append(tableOf(["run", "folder", "state", "records", "last step", "last loss", "goodput"], rows));
    const key = el("div", { class: "events-key" }, ["events on the x axis: ",
      ...Object.entries(EVENT_COLORS).map(([k, c]) => el("span", {}, [el("span", { class: "swatch", style: "background:" + c }), k]))]);
    box.append(key);
  }

  function verdictTables(payload, box) {
    if (!payload.runs.some((r) => Object.keys(r.verdict.shares).length)) return;
    box.append(el("h2", { text: "Where the step time goes, and the bottleneck verdict" }));
    const phases = ["data_wait", "forward", "backward", "optimizer", "communication", "other"];
    box.append(tableOf(["run", ...phases.map((p) => p + " %")], payload.runs.map((run, i) =>
      [el("span", {}, [swatch(i), run.name]), ...phases.map((p) => num(run.verdict.shares[p], 1))])));
    payload.runs.forEach((run, i) => {
      if (!run.verdict.lines.length) return;
      box.append(el("div", { class: "verdict" }, [swatch(i), el("b", { text: run.name + (run.verdict.final ? "" : " (live)") + ": " }),
        ...run.verdict.lines.flatMap((line) => [line, el("br")])]));
    });
  }

  function goodputTables(payload, box) {
    const runs = payload.runs.filter((r) => r.goodput.wall_s !== undefined);
    if (!runs.length) return;
    box.append(el("h2", { text: "Goodput: time that produced kept steps ÷ wall-clock" }));
    const items = Object.keys(runs[0].goodput.lost);
    box.append(tableOf(["run", "goodput", "wall-clock", "kept steps", ...items],
      runs.map((run) => {
        const g = run.goodput, i = payload.runs.indexOf(run);
        return [el("span", {}, [swatch(i), run.name]), pct(g.goodput), duration(g.wall_s), duration(g.productive_s),
          ...items.map((k) => duration(g.lost[k]) + (k === "other" ? "" : " (" + g.counts[k] + ")"))];
      })));
  }

  function mixtureTables(payload, box) {
    const runs = payload.runs.filter((r) => r.mixture.length);
    if (!runs.length) return;
    box.append(el("h2", { text: "Mixture per stage: requested (outline) against realised (filled) share of tokens" }));
    const rows = [];
    for (const run of runs) for (const stage of run.mixture) for (const s of stage.sources) {
      const bars = el("span", {}, [el("span", { class: "bar", style: "width:" + 200 * s.realised + "px" }), el("br"),
        el("span", { class: "bar requested", style: "width:" + 200 * (s.requested || 0) + "px" })]);
      rows.push([run.name, String(stage.stage), stage.steps.join("–"), s.name, s.requested === null ? "n/a" : pct(s.requested),
        pct(s.realised), num(s.tokens, 0), bars]);
    }
    box.append(tableOf(["run", "stage", "steps", "source", "requested", "realised", "tokens", ""], rows));
  }

  function eventTables(payload, box) {
    payload.runs.forEach((run, i) => {
      if (!run.events.length && !run.checkpoints.length) return;
      const shown = run.events.slice(-500);
      const details = el("details", {}, [el("summary", {}, [swatch(i), run.name + ": " + run.events.length + " events, " +
        run.checkpoints.length + " checkpoints kept"])]);
      details.append(tableOf(["step", "event", "details"], shown.map((e) => [String(e.step), e.event, e.details])));
      details.append(tableOf(["checkpoint", "step", "tokens", "bytes"], run.checkpoints.map((c) =>
        [c.name, String(c.step), num(c.tokens_seen, 0), num(c.bytes, 0)])));
      box.append(details);
    });
  }

  function configTable(payload, box) {
    if (payload.runs.length < 2) return;
    box.append(el("h2", { text: "Config differences against the first run" }));
    if (!payload.config_diff.length) { box.append(el("p", { text: "The runs' config.yaml files are the same." })); return; }
    box.append(tableOf(["key", ...payload.runs.map((r) => r.name)],
      payload.config_diff.map((row) => [row.key, ...row.values.map((v) => (v === null ? "—" : v))])));
  }

  function tuneViews(payload, box, chartBox) {
    for (const tune of payload.tunes) {
      const measured = tune.candidates.filter((c) => c.measured_step_s !== null);
      box.append(el("h2", { text: "dlx tune " + tune.name + ": predicted against measured step time" }));
      const about = Object.entries(tune.about).map(([k, v]) => k + " " + v).join(", ");
      box.append(el("p", { text: about + "; " + tune.candidates.length + " candidates, " + measured.length + " measured" }));
      box.append(tableOf(["layout", "predicted before (s)", "predicted (s)", "measured (s)", "error", "tokens/s", "MFU", "peak GB", "why dropped"],
        measured.map((c) => [c.winner ? "★ " + c.label : c.label, num(c.predicted_before_measured_s), num(c.predicted_step_s),
          num(c.measured_step_s), pct(c.predicted_step_s / c.measured_step_s - 1), num(c.tokens_per_s, 0), pct(c.mfu),
          num(c.peak_mem_gb, 3), c.drop || (c.winner ? "winner" : "")])));
      if (!measured.length) continue;
      const holder = el("div", { class: "chart", "data-title": "tune " + tune.name }, [el("h3", { text: "tune " + tune.name +
        ": step time per measured candidate (1 = winner)" })]);
      chartBox.append(holder);
      const xs = measured.map((_, i) => i + 1);
      const pts = (stroke, label) => ({ label, stroke, width: 0, points: { show: true, size: 7, fill: stroke } });
      charts.push(new uPlot({ width: Math.max(300, holder.clientWidth - 14), height: 240, scales: { x: { time: false } },
        series: [{ label: "candidate" }, pts("#999", "predicted before measuring"), pts("#1f77b4", "predicted"), pts("#d62728", "measured")],
        plugins: [{ hooks: { draw: [() => { view.drawn += 1; }] } }] },
        [xs, measured.map((c) => c.predicted_before_measured_s), measured.map((c) => c.predicted_step_s),
          measured.map((c) => c.measured_step_s)], holder));
    }
  }

  // ---- the page -----------------------------------------------------------------------------------------------
  function render(payload) {
    for (const c of charts) c.destroy();
    charts = [];
    const problems = document.getElementById("problems"), runs = document.getElementById("runs");
    const chartBox = document.getElementById("charts"), tables = document.getElementById("tables");
    for (const box of [problems, runs, chartBox, tables]) box.replaceChildren();
    payload.problems.forEach((p) => problems.append(el("li", { text: p })));
    runsTable(payload, runs);
    drawCharts(payload, chartBox);
    verdictTables(payload, tables);
    goodputTables(payload, tables);
    mixtureTables(payload, tables);
    tuneViews(payload, tables, chartBox);
    configTable(payload, tables);
    eventTables(payload, tables);
    const timeKinds = new Set(payload.runs.map((r) => r.time_kind));
    document.querySelector('#axis option[value="time"]').textContent =
      timeKinds.has("trained") ? "wall-clock (step time only where a run has no time)" : "wall-clock";
    view.charts = charts.length;
    view.plots = charts;
    view.renders += 1;
    if (view.readyMs === null) {
      view.readyMs = performance.now();
      requestAnimationFrame(() => requestAnimationFrame(() => { view.paintMs = performance.now(); }));
    }
    document.body.dataset.ready = String(view.renders);
  }

  function show(text) {
    if (text === payloadText) return;
    payloadText = text;
    render(JSON.parse(text));
  }

  function poll(every) {
    fetch("data.json", { cache: "no-store" })
      .then((r) => { if (!r.ok) throw new Error("data.json: HTTP " + r.status); return r.text(); })
      .then((text) => {
        show(text);
        const seconds = JSON.parse(text).refresh_s || 2;
        document.getElementById("state").textContent = "following: read " + new Date().toLocaleTimeString() +
          ", every " + seconds + " s";
        setTimeout(() => poll(seconds), seconds * 1000);
      })
      .catch((e) => {
        document.getElementById("state").textContent = "server unreachable (" + e.message + "); retrying";
        setTimeout(() => poll(every), every * 1000);
      });
  }

  document.getElementById("axis").addEventListener("change", (e) => {
    axis = e.target.value;
    zoom = null;
    if (payloadText !== null) render(JSON.parse(payloadText));
  });
  let resizing = null;
  window.addEventListener("resize", () => {  // charts take their width from the grid: draw them again
    clearTimeout(resizing);
    resizing = setTimeout(() => { if (payloadText !== null) render(JSON.parse(payloadText)); }, 200);
  });
  const embedded = document.getElementById("dlx-data").textContent.trim();
  if (embedded) {
    show(embedded);
    document.getElementById("state").textContent = "a snapshot: written " + (JSON.parse(embedded).written || "");
  } else {
    poll(2);
  }
})();
