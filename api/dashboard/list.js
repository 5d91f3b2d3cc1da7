// Jobs list (`/`): one row per job, refreshed every few seconds while the page is open.
// Latest reward / eval pass@1 come from a small metrics window, fetched only when a job's
// step changed (the API is rate-limited per key; a list of idle jobs costs one call a poll).
"use strict";
(() => {
  const { getJSON, el, fmt, fmtTime, statusPill, stageAt } = Brorl;
  const POLL_MS = 4000;
  const latest = new Map(); // job id -> {step, reward, pass1, updated}

  async function summary(job) {
    const cached = latest.get(job.id);
    if (cached && cached.step === job.step && cached.status === job.status) return cached;
    const every = job.overview.eval_every || 0;
    const after = Math.max(job.step - Math.max(every, 1) - 1, -1);
    const s = { step: job.step, status: job.status, reward: null, pass1: null, updated: null };
    if (job.step > 0 || job.status !== "queued") {
      const page = await getJSON(`/v1/jobs/${job.id}/metrics?after_step=${after}&limit=${every + 2}`);
      for (const row of page.data) {
        if (row.values.reward_mean != null) s.reward = row.values.reward_mean;
        if (row.values["eval/pass@1"] != null) s.pass1 = row.values["eval/pass@1"];
        s.updated = row.created_at;
      }
    }
    latest.set(job.id, s);
    return s;
  }

  function row(job, s) {
    const st = stageAt(job.overview.schedule, Math.max(job.step, 1));
    const bar = el("progress", { max: job.total_steps, value: job.step });
    return el("tr", { "data-job": job.id },
      el("td", {}, statusPill(job.status)),
      el("td", {}, el("a", { href: `/jobs/${job.id}`, text: job.name })),
      el("td", { text: job.overview.model }),
      el("td", { text: job.overview.task }),
      el("td", { text: st ? `${st.index} · N=${st.n}` : "" }),
      el("td", {}, bar, ` ${job.step} / ${job.total_steps}`),
      el("td", { class: "reward", text: fmt(s.reward) }),
      el("td", { class: "pass1", text: fmt(s.pass1) }),
      el("td", { text: fmtTime(job.created_at) }),
      el("td", { text: fmtTime(job.finished_at || s.updated || job.started_at) }));
  }

  let timer = null;
  async function refresh() {
    clearTimeout(timer);
    const status = document.getElementById("status-filter").value;
    try {
      const page = await getJSON(`/v1/jobs?limit=50${status ? `&status=${status}` : ""}`);
      const rows = [];
      for (const job of page.data) rows.push(row(job, await summary(job)));
      document.querySelector("#jobs tbody").replaceChildren(...rows);
      document.getElementById("empty").hidden = page.data.length > 0;
      document.getElementById("list-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      document.getElementById("list-updated").textContent = `error: ${e.message}`;
      if (e.status === 401) return;
    }
    timer = setTimeout(refresh, POLL_MS);
  }

  Brorl.requireKey(() => {
    document.getElementById("status-filter").addEventListener("change", refresh);
    refresh();
  });
})();
