// Probe page (`/probes/{id}`): the pass@k curve on a log2 k axis with its bootstrap band, a
// histogram of per-prompt pass rates (c / n), the recommendation and a button that opens the
// submit page with the recommended job spec. Polls the probe until it has finished.
"use strict";
(() => {
  const { api, getJSON, el, fmt, statusPill, TERMINAL } = Brorl;
  const probeId = decodeURIComponent(location.pathname.split("/").pop());
  const BINS = 10;
  let probe = null;

  function render() {
    document.getElementById("probe-title").textContent = `Probe ${probe.id}`;
    document.getElementById("probe-status").replaceChildren(statusPill(probe.status));
    document.getElementById("probe-progress").textContent = `${probe.step} / ${probe.total_steps} samples`;
    const s = probe.spec, m = s.model || {};
    const model = m.job ? `checkpoint of job ${m.job} (step ${m.step == null ? "newest" : m.step})` : m.path;
    const task = s.task && (s.task.reasoning_gym ? s.task.reasoning_gym.name : `dataset ${s.task.dataset.id}`);
    const what = document.getElementById("probe-what");
    what.replaceChildren(`model ${model} · task ${task} · n ${s.n} × ${s.prompts} prompts · temperature ${s.temperature}`);
    if (m.job) what.append(" · ", el("a", { href: `/jobs/${encodeURIComponent(m.job)}`, text: "its job" }));
    document.getElementById("cancel").hidden = TERMINAL.includes(probe.status);
    const err = document.getElementById("probe-error");
    err.hidden = !probe.error;
    err.textContent = probe.error || "";
    document.getElementById("spec").textContent = jsyaml.dump(s, { sortKeys: false });
  }

  const logTicks = (u, splits) => splits.map((v) => (Number.isInteger(v) ? String(2 ** v) : ""));

  function drawCurve(result) {
    const box = document.getElementById("chart-passk");
    const ks = Object.keys(result.pass_at_k).map(Number).sort((a, b) => a - b);
    const rows = ks.map((k) => result.pass_at_k[String(k)]);
    const data = [ks.map((k) => Math.log2(k)), rows.map((r) => r.mean), rows.map((r) => r.lo), rows.map((r) => r.hi)];
    const opts = {
      title: "pass@k (95 % bootstrap band over prompts)", width: Math.max(box.clientWidth, 300), height: Charts.HEIGHT,
      scales: { x: { time: false, range: Charts.xRange }, y: { range: [0, 1] } },
      axes: [{ label: "k (log2 axis)", values: logTicks, incrs: [1] }, { size: 50 }],
      series: [{ label: "log2 k" },
               { label: "pass@k", stroke: Charts.PALETTE[0], width: 2, points: { show: true, size: 5 } },
               { label: "low", stroke: Charts.PALETTE[0] + "66", dash: [4, 3] },
               { label: "high", stroke: Charts.PALETTE[0] + "66", dash: [4, 3] }],
      bands: [{ series: [3, 2], fill: Charts.PALETTE[0] + "22" }],
      hooks: { draw: [() => { box.dataset.drawn = "true"; }] },
    };
    box.replaceChildren();
    new uPlot(opts, data, box);
    box.dataset.points = String(ks.length);
  }

  function drawHistogram(result) {
    const box = document.getElementById("chart-hist");
    const counts = new Array(BINS).fill(0);
    for (const p of result.per_prompt) counts[Math.min(BINS - 1, Math.floor((p.correct / p.n) * BINS))] += 1;
    const xs = counts.map((_, i) => (i + 0.5) / BINS);
    const opts = {
      title: "prompts by pass rate c / n", width: Math.max(box.clientWidth, 300), height: Charts.HEIGHT,
      scales: { x: { time: false, range: [0, 1] }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      axes: [{ label: "pass rate" }, { size: 40 }],
      series: [{ label: "pass rate" },
               { label: "prompts", stroke: Charts.PALETTE[2], fill: Charts.PALETTE[2] + "88",
                 paths: uPlot.paths.bars({ size: [0.9, 100] }), points: { show: false } }],
      hooks: { draw: [() => { box.dataset.drawn = "true"; }] },
    };
    box.replaceChildren();
    new uPlot(opts, [xs, counts], box);
    box.dataset.points = String(result.per_prompt.length);
  }

  function showFigures(result) {
    const sw = result.solvable_all_wrong;
    const rows = [
      ["all-wrong at 16, solved within n", sw["16"]], ["all-wrong at 64, solved within n", sw["64"]],
      ["all-wrong at 256, solved within n", sw["256"]], ["never solved", result.never_solved],
      ["mean response length (tokens)", result.response_len_mean], ["truncated", result.truncated_frac],
      ["tokens", result.tokens], ["seconds", result.seconds], ["samples/s", result.samples_per_s],
    ];
    const env = result.env;  // a task.env job's probe sampled episodes
    if (env) rows.push(
      ["turns per episode", env.turns_mean], ["tool calls per episode", env.tool_calls_mean],
      ["tool errors per episode", env.tool_errors_mean], ["cut by the episode budget", env.budget_truncated_frac],
      ["episodes the environment broke", env.errors], ["seconds in the environment", env.seconds]);
    document.querySelector("#figures tbody").replaceChildren(...rows.map(([name, v]) =>
      el("tr", {}, el("th", { text: name }), el("td", { text: v == null ? "–" : fmt(v) }))));
  }

  function showRecommendation(rec) {
    const box = document.getElementById("recommendation");
    const stages = rec.schedule.map((s, i) =>
      el("li", { text: `stage ${i}: N = ${s.n} × ${s.prompts_per_step} prompts, ${s.steps} steps, lr ${fmt(s.lr)}` }));
    if (rec.broaden_on_plateau) stages.push(el("li", { text: `rollout.broaden: ${JSON.stringify(rec.broaden_on_plateau)}` }));
    box.replaceChildren(el("p", {}, el("strong", { id: "verdict", text: rec.verdict }), ": ", rec.reason),
                        el("ul", { id: "schedule" }, ...stages));
    const button = document.getElementById("use-recommendation");
    button.hidden = false;
    button.onclick = () => {
      sessionStorage.setItem("brorl.submitPrefill", jsyaml.dump(rec.spec, { sortKeys: false }));
      location.assign("/submit");
    };
  }

  async function refresh() {
    probe = await getJSON(`/v1/probes/${encodeURIComponent(probeId)}`);
    render();
    if (probe.result) {
      drawCurve(probe.result);
      drawHistogram(probe.result);
      showFigures(probe.result);
      showRecommendation(probe.result.recommendation);
    }
    if (!TERMINAL.includes(probe.status)) setTimeout(() => refresh().catch(() => {}), 2000);
  }

  async function start() {
    try {
      await refresh();
    } catch (e) {
      document.getElementById("probe-title").textContent = e.status === 404 ? `No probe ${probeId} (or not yours)` : e.message;
      return;
    }
    document.getElementById("cancel").addEventListener("click", async () => {
      if (!confirm("Cancel this probe? A running probe stops after its current chunk.")) return;
      try {
        probe = await (await api(`/v1/probes/${encodeURIComponent(probeId)}/cancel`, { method: "POST" })).json();
        render();
      } catch (e) { alert(e.message); }
    });
  }

  Brorl.requireKey(start);
})();
