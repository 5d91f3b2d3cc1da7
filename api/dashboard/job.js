// Job page (`/jobs/{id}`): every chart group, fed by the metrics SSE stream (no reload), the
// phase line (the stream's `progress` events: warm start, model load, engine start,
// evaluation), the x-axis switch, the events timeline, the checkpoints (download + sha256
// check), the spec, and cancel.
"use strict";
(() => {
  const { api, getJSON, el, fmt, fmtTime, statusPill, scheduleText, TERMINAL } = Brorl;
  const jobId = decodeURIComponent(location.pathname.split("/").pop());
  const v = (k) => (values) => values[k];

  // The chart groups (metric names: trainer/step.py and trainer/evaluate.py).
  const GROUPS = [
    { id: "reward", title: "Reward and pass rate", series: [
      { label: "reward mean", get: v("reward_mean") },
      { label: "mean + std", get: (x) => x.reward_mean + x.reward_std, dash: [4, 4], color: "#56B4E9" },
      { label: "mean − std", get: (x) => x.reward_mean - x.reward_std, dash: [4, 4], color: "#56B4E9" },
      { label: "pass rate", get: v("pass_rate"), color: "#E69F00" }] },
    { id: "eval", title: "Eval pass@k", evalSeries: true, series: [] },
    { id: "schedule", title: "Broadening schedule: N and lr", y2label: "lr", series: [
      { label: "N (rollouts per prompt)", get: v("n"), step: true },
      { label: "lr", get: v("lr"), step: true, axis: "y2" }] },
    { id: "filter", title: "Dynamic sampling", y2label: "refill rounds", series: [
      { label: "keep rate", get: v("keep_rate") },
      { label: "all-correct groups", get: v("frac_all_correct") },
      { label: "all-wrong groups", get: v("frac_all_wrong") },
      { label: "prompts retired (share)", get: v("prompts_retired_frac") },
      { label: "refill rounds", get: v("refill_rounds"), axis: "y2", step: true }] },
    { id: "kl", title: "KL and entropy", series: [
      { label: "KL", get: v("kl") }, { label: "entropy", get: v("entropy"), axis: "y2" }] },
    { id: "clip", title: "Clipping and importance ratios", series: [
      { label: "clip frac low", get: v("pg_clipfrac_low") },
      { label: "clip frac high", get: v("pg_clipfrac_high") },
      { label: "IS-ratio truncated", get: v("is_truncated_frac") },
      { label: "IS ESS (normalised)", get: v("is_ess") },
      { label: "engine/trainer KL", get: v("mismatch_kl") },
      { label: "IS-ratio mean", get: v("is_ratio_mean"), axis: "y2" }] },
    { id: "grad", title: "Loss and grad norm", series: [
      { label: "grad norm", get: v("grad_norm") }, { label: "loss", get: v("loss"), axis: "y2" }] },
    { id: "length", title: "Response length", y2label: "truncated", series: [
      { label: "mean length", get: v("response_len_mean") },
      { label: "max length", get: v("response_len_max") },
      { label: "truncated fraction", get: v("truncated_frac"), axis: "y2" }] },
    { id: "throughput", title: "Throughput", y2label: "tokens/s", series: [
      { label: "samples/s", get: v("samples_per_s") },
      { label: "tokens/s", get: v("tokens_per_s"), axis: "y2" }] },
    { id: "time", title: "Step time split (s, stacked)", stacked: true, series: [
      { label: "generate", get: v("gen_s") }, { label: "score", get: v("score_s") },
      { label: "train", get: v("train_s") }, { label: "weight sync", get: v("weight_sync_s") }] },
    { id: "memory", title: "Peak memory (MB)", series: [{ label: "peak MB", get: v("peak_mem_mb") }] },
  ];
  // A job rewarded by `task.grader` also charts the grader's health and, for a multi grader,
  // each sub-reward: `reward/<key>` series found in the metric rows as they arrive.
  const GRADER_GROUPS = [
    { id: "grader", title: "Grader errors, timeouts and time", y2label: "seconds", series: [
      { label: "errors", get: v("grader/errors") },
      { label: "timeouts", get: v("grader/timeouts") },
      { label: "grading seconds", get: v("grader/seconds"), axis: "y2" }] },
    { id: "subrewards", title: "Sub-rewards (mean per step)", subRewards: true, series: [] },
  ];
  const subKeys = [];
  // A multi-turn job (`task.env`) charts its episodes: turns, tool calls and failed tool calls
  // per episode, the share cut by the token budget, the environment's seconds and the episodes
  // the environment itself broke. Shown when the spec has `task.env` or a metric row carries
  // these names.
  const ENV_GROUPS = [
    { id: "env", title: "Agent episodes (mean per episode)", y2label: "fraction", series: [
      { label: "turns", get: v("env/turns_mean") },
      { label: "tool calls", get: v("env/tool_calls_mean") },
      { label: "tool errors", get: v("env/tool_errors_mean"), color: "#D55E00" },
      { label: "cut by token budget", get: v("env/budget_truncated_frac"), axis: "y2", dash: [4, 4] }] },
    { id: "envtime", title: "Environment time and broken episodes", y2label: "episodes", series: [
      { label: "environment seconds", get: v("time/env_s") },
      { label: "generate seconds", get: v("gen_s") },
      { label: "environment errors", get: v("env/errors"), axis: "y2", color: "#D55E00", step: true }] },
  ];
  const ENV_KEYS = ["env/turns_mean", "env/tool_calls_mean", "env/tool_errors_mean",
                    "env/budget_truncated_frac", "time/env_s"];
  let envCharts = false;

  let job = null;
  const rows = [];
  let charts = [];
  let mode = "step";

  function evalSeries() {
    const ks = (job.spec.eval && job.spec.eval.k) || [1];
    const all = Array.from(new Set([1, ...ks])).sort((a, b) => a - b);
    return all.map((k) => ({ label: `pass@${k}`, get: v(`eval/pass@${k}`), points: true }));
  }

  function groups() {
    const grader = job.spec.task && job.spec.task.grader;
    const env = envCharts || Boolean(job.spec.task && job.spec.task.env) ? ENV_GROUPS : [];
    if (!grader) return GROUPS.concat(env);
    return GROUPS.concat(grader.type === "multi" ? GRADER_GROUPS : GRADER_GROUPS.slice(0, 1), env);
  }

  // True when the row is the first to carry an episode metric (the charts are then rebuilt).
  function newEnvMetrics(values) {
    if (envCharts || (job.spec.task && job.spec.task.env)) return false;
    envCharts = ENV_KEYS.some((k) => k in values);
    return envCharts;
  }

  function buildCharts() {
    const box = document.getElementById("charts");
    box.replaceChildren();
    charts = groups().map((g) => {
      let spec = g;
      if (g.evalSeries) spec = Object.assign({}, g, { series: evalSeries() });
      if (g.subRewards) {
        spec = Object.assign({}, g, { series: subKeys.map((k) => ({ label: k, get: v(`reward/${k}`) })) });
      }
      return new Charts.Chart(box, spec, mode, `job-${jobId}`);
    });
  }

  // True when the row names a sub-reward not charted yet (the charts are then rebuilt).
  function newSubRewards(values) {
    const fresh = Object.keys(values).filter((k) => k.startsWith("reward/"))
      .map((k) => k.slice("reward/".length)).filter((k) => !subKeys.includes(k));
    subKeys.push(...fresh.sort());
    return fresh.length > 0;
  }

  // The phase a running job is in (trainer/events.py `Phase`), from its newest progress event;
  // hidden once that phase ends or the job stops running.
  const PHASES = { launch: "launching the ranks", task: "building the task",
    warm_start: "warm-starting builtin:tiny", model_load: "loading the model",
    engine_start: "starting the rollout engine", eval: "evaluating" };
  let phase = null;
  function renderPhase() {
    const box = document.getElementById("job-phase");
    const d = phase && phase.data;
    box.hidden = !d || d.finished || !job || job.status !== "running";
    if (box.hidden) { box.replaceChildren(); return; }
    box.dataset.phase = d.phase || "";
    const parts = [el("strong", { text: PHASES[d.phase] || d.phase || "working" })];
    if (d.total) parts.push(el("progress", { max: d.total, value: d.done || 0 }), `${d.done || 0} / ${d.total}`);
    if (d.message) parts.push(el("span", { class: "muted", text: ` · ${d.message}` }));
    box.replaceChildren(...parts);
  }

  const t0 = () => (job && job.started_at ? Date.parse(job.started_at) : null);
  const redraw = Charts.throttle(() => charts.forEach((c) => c.setRows(rows, t0())), 300);

  function renderJob() {
    document.title = `${job.name} · BroRL`;
    document.getElementById("job-title").textContent = `${job.name} (${job.id})`;
    document.getElementById("job-status").replaceChildren(statusPill(job.status));
    document.getElementById("job-progress").replaceChildren(
      el("progress", { max: job.total_steps, value: job.step }), ` step ${job.step} / ${job.total_steps}`);
    document.getElementById("job-schedule").textContent =
      `model ${job.spec.model.path} · schedule ${scheduleText(job.overview.schedule)}` +
      (job.cancel_requested && !TERMINAL.includes(job.status) ? " · cancel requested" : "");
    const errBox = document.getElementById("job-error");
    errBox.hidden = !job.error;
    errBox.textContent = job.error || "";
    // The trainer's latest warning (a stall, a gamed reward, a few-prompts stage) stays in view.
    const warnBox = document.getElementById("job-warning");
    warnBox.hidden = !job.warning;
    warnBox.textContent = job.warning ? `warning: ${job.warning}` : "";
    document.getElementById("cancel").hidden = TERMINAL.includes(job.status) || job.cancel_requested;
    document.getElementById("job-eta").textContent = etaText(job);
    renderPhase();
  }

  /** A queued job's place in its GPU queue, or a running job's time left (GET /v1/jobs/{id}). */
  function etaText(j) {
    const q = j.queue;
    if (q) return `queued: position ${q.position} on ${q.multi_node ? "the multi-node queue" : `the ${q.gpus}-GPU queue`} (${q.yours_ahead.length} of yours, ${q.others_ahead} other(s) ahead; ${q.running} running)`;
    if (j.eta_seconds == null) return "";
    const m = Math.round(j.eta_seconds / 60);
    return `about ${m < 1 ? "<1" : m} min left (ETA ${fmtTime(j.eta_at)})`;
  }

  async function refreshJob() {
    job = await getJSON(`/v1/jobs/${jobId}`);
    renderJob();
  }

  // --- events and checkpoints: polled modestly while the job runs
  let lastEvent = null;
  let eventsChain = Promise.resolve();
  // Calls are chained: two overlapping fetches from the same `after` would list events twice.
  function refreshEvents() {
    eventsChain = eventsChain.then(loadEvents, loadEvents);
    return eventsChain;
  }
  async function loadEvents() {
    for (;;) {
      const page = await getJSON(`/v1/jobs/${jobId}/events?limit=200${lastEvent != null ? `&after=${lastEvent}` : ""}`);
      const body = document.querySelector("#events tbody");
      for (const e of page.data) {
        lastEvent = e.id;
        // A phase's updates live in the phase line; the timeline keeps the phase's end.
        if (e.type === "progress" && e.data.phase && !e.data.finished) continue;
        if (e.type === "warning" && job) { job.warning = e.data.message; renderJob(); }
        const details = e.data.message || e.data.error || e.data.reason ||
          Object.entries(e.data).map(([k, x]) => `${k}=${typeof x === "number" ? fmt(x) : x}`).join(" ");
        body.append(el("tr", { class: `ev-${e.type}` }, el("td", { text: fmtTime(e.created_at) }),
          el("td", { text: e.type }), el("td", { class: "details", text: details })));
      }
      if (!page.has_more) return;
    }
  }

  async function sha256Hex(blob) {
    const digest = await crypto.subtle.digest("SHA-256", await blob.arrayBuffer());
    return Array.from(new Uint8Array(digest)).map((b) => b.toString(16).padStart(2, "0")).join("");
  }

  // A plain link cannot carry the bearer header: fetch, check the archive's sha256 against
  // X-Checksum-Sha256, then hand the blob to the browser as a download.
  async function download(ck, cell, merged) {
    cell.textContent = "downloading…";
    try {
      const r = await api(merged ? ck.merged_download_url : ck.download_url);
      const expected = (r.headers.get("X-Checksum-Sha256") || "").replace(/"/g, "");
      const blob = await r.blob();
      const got = await sha256Hex(blob);
      const ok = got === expected;
      cell.replaceChildren(el("code", { class: "archive-sha", text: got }),
        el("span", { class: ok ? "sha-ok" : "error", text: ok ? " ✓ matches the server" : ` ✗ server says ${expected}` }));
      const a = el("a", { href: URL.createObjectURL(blob), download: `${jobId}-step${ck.step}${merged ? "-merged" : ""}.tar.gz` });
      document.body.append(a);
      a.click();
      a.remove();
    } catch (e) {
      cell.replaceChildren(el("span", { class: "error", text: e.message }));
    }
  }

  async function refreshCheckpoints() {
    const page = await getJSON(`/v1/jobs/${jobId}/checkpoints`);
    const body = document.querySelector("#checkpoints tbody");
    // Re-render only when the list changed: a redraw would drop a download's checksum cell.
    const signature = page.data.map((ck) => `${ck.step}:${ck.sha256}`).join(",");
    if (signature === body.dataset.signature) return;
    body.dataset.signature = signature;
    body.replaceChildren(...page.data.map((ck) => {
      const shaCell = el("td", { class: "archive" });
      return el("tr", { "data-step": ck.step },
        el("td", { text: ck.step }), el("td", { text: `${(ck.bytes / 1e6).toFixed(2)} MB` }),
        el("td", {}, el("code", { text: ck.sha256 })), el("td", { text: fmtTime(ck.created_at) }),
        // A LoRA checkpoint: PEFT's adapter, or the base with it merged in (an HF folder).
        ck.kind === "lora"
          ? el("td", {}, el("button", { class: "download", text: "adapter (PEFT) .tar.gz",
                                        title: "adapter_config.json + adapter_model.safetensors: load onto the base with peft, or vLLM --enable-lora",
                                        onclick: () => download(ck, shaCell, false) }), " ",
               el("button", { class: "download-merged", text: "merged HF model .tar.gz",
                              title: "the base with the adapter merged in: loads with transformers or vLLM, no peft",
                              onclick: () => download(ck, shaCell, true) }))
          : el("td", {}, el("button", { class: "download", text: "HF model .tar.gz",
                                        onclick: () => download(ck, shaCell, false) })),
        shaCell);
    }));
  }

  // The probes of this job's checkpoints (a probe's model is {job, step}), newest first.
  async function refreshProbes() {
    const page = await getJSON("/v1/probes?limit=100");
    const mine = page.data.filter((p) => p.model && p.model.job === jobId);
    document.getElementById("probes").replaceChildren(...mine.map((p) => el("li", {},
      el("a", { href: `/probes/${p.id}`, text: p.id }),
      ` step ${p.model.step == null ? "newest" : p.model.step} · `, Brorl.statusPill(p.status))));
  }

  async function probeNewest() {
    const msg = document.getElementById("probe-msg");
    msg.textContent = "";
    try {
      const probe = await (await api("/v1/probes", { method: "POST", json: { model: { job: jobId } } })).json();
      location.assign(`/probes/${probe.id}`);
    } catch (e) { msg.textContent = e.message; }
  }

  let sideTimer = null;
  async function refreshSide() {
    clearTimeout(sideTimer);
    try { await Promise.all([refreshJob(), refreshEvents(), refreshCheckpoints(), refreshProbes()]); } catch (_) { /* next poll */ }
    if (!TERMINAL.includes(job.status)) sideTimer = setTimeout(refreshSide, 5000);
  }

  async function start() {
    try {
      await refreshJob();
    } catch (e) {
      document.getElementById("job-title").textContent = e.status === 404 ? `No job ${jobId} (or not yours)` : e.message;
      return;
    }
    document.getElementById("spec").textContent = jsyaml.dump(job.spec, { sortKeys: false });
    buildCharts();
    document.querySelectorAll("input[name=xaxis]").forEach((r) => r.addEventListener("change", () => {
      mode = r.value;
      charts.forEach((c) => c.setMode(mode));
    }));
    document.getElementById("cancel").addEventListener("click", async () => {
      if (!confirm(`Cancel job ${job.name}? A running job stops at its next step.`)) return;
      try {
        job = await (await api(`/v1/jobs/${jobId}/cancel`, { method: "POST" })).json();
        renderJob();
        refreshSide();
      } catch (e) { alert(e.message); }
    });
    document.getElementById("probe-newest").addEventListener("click", probeNewest);
    refreshSide();
    const addSampleStep = SamplesTable(jobId);
    await Brorl.followMetrics(jobId, null, {
      metric: (row) => {
        rows.push(row);
        const fresh = newSubRewards(row.values);
        if (newEnvMetrics(row.values) || fresh) buildCharts();
        addSampleStep(row.step);
        if (job && row.step > job.step) { job.step = row.step; renderJob(); }
        redraw();
      },
      progress: (event) => { phase = event; renderPhase(); },
      // A refused read (a 429 under the per-key rate limit) waits for the next poll.
      status: async () => { try { await refreshJob(); } catch (_) { /* next poll */ } refreshSide(); },
      end: async () => { try { await refreshJob(); } catch (_) { /* next poll */ } refreshSide(); },
    });
  }

  Brorl.requireKey(start);
})();
