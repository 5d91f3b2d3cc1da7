// Evaluation page (`/evaluations/{id}`): per model (the base, then each checkpoint) pass@k with
// its 95 % interval, the delta against the base with its paired interval and the prompts gained
// or lost; a chart of pass@1 per model with its interval; the per-prompt counts. Polls the
// evaluation until it has finished (docs/evaluation.md).
"use strict";
(() => {
  const { api, getJSON, el, statusPill, TERMINAL } = Brorl;
  const evalId = decodeURIComponent(location.pathname.split("/").pop());
  const $ = (id) => document.getElementById(id);
  let ev = null;

  const p3 = (v) => Number(v).toFixed(3);  // a share: always three decimals, so columns line up
  const interval = (r) => (r ? `${p3(r.mean)} [${p3(r.lo)}, ${p3(r.hi)}]` : "–");
  const signed = (v) => (v > 0 ? "+" : "") + p3(v);
  const delta = (r) => (r ? `${signed(r.mean)} [${signed(r.lo)}, ${signed(r.hi)}]` : "–");

  function render() {
    $("eval-title").textContent = `Evaluation ${ev.id}`;
    $("eval-status").replaceChildren(statusPill(ev.status));
    $("eval-progress").textContent = `${ev.step} / ${ev.total_steps} samples`;
    const s = ev.spec;
    const task = s.task && (s.task.reasoning_gym ? s.task.reasoning_gym.name : `dataset ${s.task.dataset && s.task.dataset.id}`);
    $("eval-what").replaceChildren("job ", el("a", { href: `/jobs/${encodeURIComponent(ev.job_id)}`, text: ev.job_id }),
      ` · steps ${ev.checkpoints.join(", ")}${ev.base ? " and the base" : ""} · task ${task} · `
      + `n ${s.n}${s.prompts ? ` × ${s.prompts} prompts` : " × the eval split"} · temperature ${s.temperature}`);
    $("cancel").hidden = TERMINAL.includes(ev.status);
    $("eval-error").hidden = !ev.error;
    $("eval-error").textContent = ev.error || "";
    $("spec").textContent = jsyaml.dump(s, { sortKeys: false });
  }

  function showTable(result) {
    const ks = result.k.map(String);
    const hasBase = result.models.some((m) => m.step == null);
    const head = [el("th", { text: "model" }), ...ks.map((k) => el("th", { text: `pass@${k}` }))];
    if (hasBase) head.push(...ks.map((k) => el("th", { text: `Δ pass@${k} vs base` })), el("th", { text: "gained" }),
                           el("th", { text: "lost" }));
    $("eval-table").querySelector("thead").replaceChildren(el("tr", {}, ...head));
    const best = result.best && result.best.step;
    $("eval-table").querySelector("tbody").replaceChildren(...result.models.map((m) => {
      const cells = [el("th", { text: m.label + (m.step != null && m.step === best ? " ★ best" : "") }),
                     ...ks.map((k) => el("td", { class: "num", text: interval(m.pass_at_k[k]) }))];
      if (hasBase) {
        cells.push(...ks.map((k) => {
          const d = m.delta && m.delta[k];
          const cls = d && d.lo > 0 ? "num gained" : d && d.hi < 0 ? "num lost" : "num";
          return el("td", { class: cls, text: delta(d) });
        }));
        cells.push(el("td", { class: "num", text: m.changes ? String(m.changes.gained.length) : "–" }),
                   el("td", { class: "num", text: m.changes ? String(m.changes.lost.length) : "–" }));
      }
      return el("tr", { "data-step": m.step == null ? "base" : String(m.step) }, ...cells);
    }));
    $("eval-interval").textContent = `${result.prompts} prompts × ${result.n} samples; intervals: ${result.interval}. `
      + "A delta whose interval excludes 0 is coloured.";
    $("eval-best").textContent = result.best
      ? `Best: ${result.best.label}, pass@1 ${p3(result.best["pass@1"])} (${result.best.rule}).` : "";
    $("eval-picked").replaceChildren(...result.picked.filter((p) => p.why).map((p) =>
      el("li", { text: `step ${p.step} (${p.asked.join(", ")}): ${p.why}` })));
  }

  function drawChart(result) {
    const box = $("chart-models");
    const xs = result.models.map((_, i) => i);
    const col = (f) => result.models.map((m) => f(m.pass_at_k["1"]));
    const opts = {
      title: "pass@1 per model (95 % interval)", width: Math.max(box.clientWidth, 300), height: Charts.HEIGHT,
      scales: { x: { time: false, range: [-0.5, xs.length - 0.5] }, y: { range: [0, 1] } },
      axes: [{ label: "model", values: (u, splits) => splits.map((v) => (Number.isInteger(v) && result.models[v]
        ? result.models[v].label : "")), incrs: [1] }, { size: 50 }],
      series: [{ label: "model" },
               { label: "pass@1", stroke: Charts.PALETTE[0], width: 0, points: { show: true, size: 9 } },
               { label: "low", stroke: Charts.PALETTE[0] + "99", width: 0, points: { show: true, size: 5 } },
               { label: "high", stroke: Charts.PALETTE[0] + "99", width: 0, points: { show: true, size: 5 } }],
      bands: [{ series: [3, 2], fill: Charts.PALETTE[0] + "22" }],
      hooks: { draw: [() => { box.dataset.drawn = "true"; }] },
    };
    box.replaceChildren();
    new uPlot(opts, [xs, col((r) => r.mean), col((r) => r.lo), col((r) => r.hi)], box);
    box.dataset.points = String(xs.length);
  }

  function showPrompts(result) {
    const models = result.models;
    $("eval-prompts").querySelector("thead").replaceChildren(el("tr", {}, el("th", { text: "#" }),
      el("th", { text: "prompt" }), ...models.map((m) => el("th", { text: m.label }))));
    $("eval-prompts").querySelector("tbody").replaceChildren(...result.prompt_texts.map((text, i) =>
      el("tr", {}, el("td", { text: String(i) }), el("td", { class: "sample-text", text }),
        ...models.map((m) => {
          const ch = m.changes;
          const cls = ch && ch.gained.includes(i) ? "num gained" : ch && ch.lost.includes(i) ? "num lost" : "num";
          return el("td", { class: cls, text: `${m.correct[i]} / ${result.n}` });
        }))));
  }

  async function refresh() {
    ev = await getJSON(`/v1/evaluations/${encodeURIComponent(evalId)}`);
    render();
    if (ev.result) {
      showTable(ev.result);
      drawChart(ev.result);
      showPrompts(ev.result);
    }
    if (!TERMINAL.includes(ev.status)) setTimeout(() => refresh().catch(() => {}), 2000);
  }

  async function start() {
    try {
      await refresh();
    } catch (e) {
      $("eval-title").textContent = e.status === 404 ? `No evaluation ${evalId} (or not yours)` : e.message;
      return;
    }
    $("cancel").addEventListener("click", async () => {
      if (!confirm("Cancel this evaluation? A running one stops after its current chunk.")) return;
      try {
        ev = await (await api(`/v1/evaluations/${encodeURIComponent(evalId)}/cancel`, { method: "POST" })).json();
        render();
      } catch (e) { alert(e.message); }
    });
  }

  Brorl.requireKey(start);
})();
