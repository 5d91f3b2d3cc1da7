// The job page's evaluations: the table of this job's evaluations (the best checkpoint of each,
// its pass@1 and its delta against the base, prompts gained / lost), each linked to its page,
// and an "Evaluate" button: the newest and the best checkpoint (by the training's eval/pass@1;
// the newest alone when the training recorded none at a stored checkpoint) against the base
// (docs/evaluation.md).
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

  async function evaluate() {
    const msg = $("evaluate-msg");
    msg.textContent = "";
    const post = (checkpoints) => api(`/v1/jobs/${jobId}/evaluations`, { method: "POST", json: { checkpoints } });
    try {
      let resp;
      try {
        resp = await post(["latest", "best"]);
      } catch (e) {
        if (e.status !== 422 || !/eval\/pass@1/.test(e.message)) throw e;
        resp = await post(["latest"]);  // no training evaluation at a stored checkpoint: the newest alone
      }
      location.assign(`/evaluations/${(await resp.json()).id}`);
    } catch (e) { msg.textContent = e.message; }
  }

  Brorl.requireKey(() => {
    $("evaluate").addEventListener("click", evaluate);
    // After the page's own first burst of requests (the per-key rate limit counts them all).
    setTimeout(refresh, 2500);
    setInterval(refresh, 10000);
  });
})();
