// The job page's evaluations: the table of this job's evaluations (the best checkpoint of each,
// its pass@1 and its delta against the base, prompts gained / lost), each linked to its page,
// and an "Evaluate" button for the checkpoints ticked ("latest", "best", or stored steps, one
// box each; by default the newest and the best, or the newest alone when the training recorded
// no eval/pass@1 at a stored checkpoint) against the base, on the job's held-out prompts or
// an uploaded dataset's (docs/evaluation.md).
"use strict";
(() => {
  const { api, getJSON, el, statusPill } = Brorl;
  const jobId = decodeURIComponent(location.pathname.split("/").pop());
  const $ = (id) => document.getElementById(id);
  const p3 = (v) => Number(v).toFixed(3);  // a share: always three decimals
  const signed = (v) => (v > 0 ? "+" : "") + p3(v);

  function row(e) {
    const r = e.result;
    const best = r && r.best && r.models.find((m) => m.step === r.best.step);
    const p1 = best ? best.pass_at_k["1"] : null;
    const d = best && best.delta ? best.delta["1"] : null;
    return el("tr", { "data-id": e.id },
      el("td", {}, el("a", { href: `/evaluations/${encodeURIComponent(e.id)}`, text: e.id })),
      el("td", {}, statusPill(e.status)),
      el("td", { text: e.checkpoints.join(", ") + (e.base ? " + base" : "") }),
      el("td", { class: "num", text: best ? String(best.step) : "" }),
      el("td", { class: "num", text: p1 ? `${p3(p1.mean)} [${p3(p1.lo)}, ${p3(p1.hi)}]` : "" }),
      el("td", { class: `num${d && d.lo > 0 ? " gained" : d && d.hi < 0 ? " lost" : ""}`,
                 text: d ? `${signed(d.mean)} [${signed(d.lo)}, ${signed(d.hi)}]` : "" }),
      el("td", { class: "num", text: best && best.changes ? `+${best.changes.gained.length} / −${best.changes.lost.length}` : "" }));
  }

  async function refresh() {
    let page;
    try { page = await getJSON(`/v1/jobs/${jobId}/evaluations`); } catch (_) { return; }  // next poll
    $("evaluations").querySelector("tbody").replaceChildren(...page.data.map(row));
    $("evaluations-empty").hidden = page.data.length > 0;
  }

  // One box per stored checkpoint step, kept ticked across refreshes.
  async function refreshSteps() {
    let page;
    try { page = await getJSON(`/v1/jobs/${jobId}/checkpoints`); } catch (_) { return; }  // next poll
    const box = $("evaluate-steps");
    const ticked = new Set([...box.querySelectorAll("input:checked")].map((i) => i.value));
    const steps = page.data.map((c) => c.step).sort((a, b) => a - b);
    box.replaceChildren(...steps.map((s) => el("label", {},
      el("input", { type: "checkbox", value: String(s), checked: ticked.has(String(s)),
                    "aria-label": `step ${s}` }), ` step ${s} `)));
  }

  function chosen() {
    return [...$("evaluate-checkpoints").querySelectorAll("input:checked")]
      .map((i) => (/^\d+$/.test(i.value) ? Number(i.value) : i.value));
  }

  async function evaluate() {
    const msg = $("evaluate-msg");
    msg.textContent = "";
    const checkpoints = chosen();
    if (!checkpoints.length) { msg.textContent = "tick at least one checkpoint"; return; }
    const dataset = $("evaluate-dataset").value.trim();
    const body = (cs) => (dataset ? { checkpoints: cs, task: { dataset: { id: dataset } } } : { checkpoints: cs });
    const post = (cs) => api(`/v1/jobs/${jobId}/evaluations`, { method: "POST", json: body(cs) });
    try {
      let resp;
      try {
        resp = await post(checkpoints);
      } catch (e) {
        const rest = checkpoints.filter((c) => c !== "best");
        // No training evaluation at a stored checkpoint: the other choices alone.
        if (e.status !== 422 || !/eval\/pass@1/.test(e.message) || !rest.length || rest.length === checkpoints.length) throw e;
        resp = await post(rest);
      }
      location.assign(`/evaluations/${(await resp.json()).id}`);
    } catch (e) { msg.textContent = e.message; }
  }

  Brorl.requireKey(() => {
    $("evaluate").addEventListener("click", evaluate);
    // After the page's own first burst of requests (the per-key rate limit counts them all).
    setTimeout(refresh, 2500);
    setInterval(refresh, 10000);
    setTimeout(refreshSteps, 3000);
    setInterval(refreshSteps, 15000);
  });
})();
