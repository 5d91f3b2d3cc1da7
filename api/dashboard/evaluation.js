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

  // pass@1 and pass@k at the largest k per model, each a point with its 95 % interval drawn as a
  // whisker (the models are categories: nothing is interpolated between them).
  function drawChart(result) {
    const box = $("chart-models");
    const ks = [...new Set(["1", String(result.k[result.k.length - 1])])];
    const xs = result.models.map((_, i) => i);
    const shift = (j) => (ks.length > 1 ? (j - 0.5) * 0.12 : 0);
    const whiskers = (u) => {
      const ctx = u.ctx;
      ks.forEach((k, j) => {
        ctx.save();
        ctx.strokeStyle = Charts.PALETTE[j];
        ctx.lineWidth = 2 * devicePixelRatio;
        result.models.forEach((m, i) => {
          const r = m.pass_at_k[k], x = u.valToPos(i + shift(j), "x", true);
          ctx.beginPath();
          ctx.moveTo(x, u.valToPos(r.lo, "y", true));
          ctx.lineTo(x, u.valToPos(r.hi, "y", true));
          ctx.stroke();
        });
        ctx.restore();
      });
      box.dataset.drawn = "true";
    };
    const opts = {
      title: "pass@k per model (95 % interval)", width: Math.max(box.clientWidth, 300), height: Charts.HEIGHT,
      scales: { x: { time: false, range: [-0.5, xs.length - 0.5] }, y: { range: [0, 1] } },
      axes: [{ label: "model", values: (u, splits) => splits.map((v) => (Number.isInteger(v) && result.models[v]
        ? result.models[v].label : "")), incrs: [1] }, { size: 50 }],
      series: [{ label: "model" }, ...ks.map((k, j) => ({ label: `pass@${k}`, stroke: Charts.PALETTE[j], width: 0,
                                                          points: { show: true, size: 9 } }))],
      hooks: { draw: [whiskers] },
    };
    box.replaceChildren();
    // Each k's points sit a little apart at its shifted x (a separate x per series is not
    // uPlot's model, so the series hold nulls where another k sits).
    const xAll = [], cols = ks.map(() => []);
    ks.forEach((k, j) => result.models.forEach((m, i) => {
      xAll.push(i + shift(j));
      cols.forEach((c, jj) => c.push(jj === j ? m.pass_at_k[k].mean : null));
    }));
    const order = xAll.map((x, i) => i).sort((a, b) => xAll[a] - xAll[b]);
    new uPlot(opts, [order.map((i) => xAll[i]), ...cols.map((c) => order.map((i) => c[i]))], box);
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
