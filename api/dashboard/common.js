// Shared by every dashboard page: the API key, calls to the /v1 API, the live metrics stream,
// and small formatting helpers. The key lives in this tab's sessionStorage only and goes out
// as the bearer header; it never appears in a URL the server sees.
"use strict";
const Brorl = (() => {
  const KEY = "brorl.apiKey";

  // `brorl up` prints `http://host/#key=...`: the fragment never reaches the server. Store it
  // and drop it from the address bar (and so from history and screenshots).
  const m = location.hash.match(/(?:^#|&)key=([^&]+)/);
  if (m) {
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }

  const key = () => sessionStorage.getItem(KEY);

  class ApiError extends Error {
    constructor(status, error) {
      super((error && error.message) || `HTTP ${status}`);
      this.status = status;
      this.type = error && error.type;
      this.field = error && error.field;
    }
  }

  async function api(path, opts = {}) {
    const headers = Object.assign({}, opts.headers || {});
    if (key()) headers.Authorization = `Bearer ${key()}`;
    const init = Object.assign({}, opts, { headers });
    if (opts.json !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(opts.json);
      delete init.json;
    }
    const r = await fetch(path, init);
    if (r.ok) return r;
    let body = null;
    try { body = await r.json(); } catch (_) { /* not JSON */ }
    const err = new ApiError(r.status, body && body.error);
    if (r.status === 401) showLogin(err.message);
    throw err;
  }
  const getJSON = async (path) => (await api(path)).json();

  // --- the key form (in every page's header)
  let onLogin = null;
  function showLogin(message) {
    const form = document.getElementById("login");
    form.hidden = false;
    document.getElementById("logout").hidden = true;
    document.getElementById("login-msg").textContent = message || "";
    document.getElementById("main").hidden = true;
  }
  function hideLogin() {
    document.getElementById("login").hidden = true;
    document.getElementById("logout").hidden = false;
    document.getElementById("main").hidden = false;
  }
  /** Run `start` once a key is known and accepted by the API. */
  function requireKey(start) {
    onLogin = start;
    const form = document.getElementById("login");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const input = form.querySelector("input");
      sessionStorage.setItem(KEY, input.value.trim());
      input.value = "";
      try {
        await getJSON("/v1/jobs?limit=1");
      } catch (e) {
        if (e.status !== 401) showLogin(e.message);
        return;
      }
      hideLogin();
      onLogin();
    });
    document.getElementById("logout").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      location.reload();
    });
    if (key()) { hideLogin(); start(); } else showLogin("Enter an API key (brorl keys create).");
  }

  // --- the metrics stream: SSE read with fetch, because EventSource cannot send a header
  /**
   * Follow /v1/jobs/{id}/metrics/stream from `afterStep`; calls on.metric(row), on.status(s),
   * on.end(s). Reconnects from the last step seen if the connection drops before `end`.
   */
  async function followMetrics(jobId, afterStep, on, signal) {
    let last = afterStep;
    for (;;) {
      let ended = false;
      try {
        const q = last == null ? "" : `?after_step=${last}`;
        const r = await api(`/v1/jobs/${jobId}/metrics/stream${q}`,
                            { signal, headers: { Accept: "text/event-stream" } });
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf = (buf + value).replace(/\r\n/g, "\n");
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            const ev = parseEvent(block);
            if (!ev) continue;
            if (ev.event === "metric") { last = ev.data.step; on.metric && on.metric(ev.data); }
            else if (ev.event === "status") on.status && on.status(ev.data);
            else if (ev.event === "progress") on.progress && on.progress(ev.data);
            else if (ev.event === "end") { ended = true; on.end && on.end(ev.data); }
          }
        }
      } catch (e) {
        if (signal && signal.aborted) return;
        if (e instanceof ApiError && e.status < 500) throw e;
      }
      if (ended || (signal && signal.aborted)) return;
      await new Promise((res) => setTimeout(res, 3000));
    }
  }
  function parseEvent(block) {
    let event = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue; // ping comment
      const i = line.indexOf(":");
      const name = i < 0 ? line : line.slice(0, i);
      const val = i < 0 ? "" : line.slice(i + 1).replace(/^ /, "");
      if (name === "event") event = val;
      else if (name === "data") data.push(val);
    }
    if (!data.length) return null;
    return { event, data: JSON.parse(data.join("\n")) };
  }

  // --- helpers shared by the pages
  function el(tag, attrs = {}, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) if (c != null) e.append(c);
    return e;
  }
  const fmt = (v, digits = 3) => {
    if (v == null || v === "") return "";
    if (typeof v !== "number") return String(v);
    if (Number.isInteger(v)) return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : v.toFixed(digits);
  };
  const fmtTime = (iso) => (iso ? new Date(iso).toLocaleString() : "");
  const TERMINAL = ["succeeded", "failed", "cancelled"];
  const statusPill = (s) => el("span", { class: `pill st-${s}`, text: s });

  /** The stages of a job's schedule (`job.overview.schedule`): [{n, prompts, steps, first}]
   * (first = first 1-based step). */
  function stages(schedule) {
    const out = [];
    let first = 1;
    for (const s of schedule || []) {
      out.push({ n: s.n, prompts: s.prompts_per_step, steps: s.steps, first });
      first += s.steps;
    }
    return out;
  }
  /** "16×25 → 64×5": N × steps per stage, the schedule in a few characters. */
  const scheduleText = (schedule) => stages(schedule).map((s) => `N=${s.n}×${s.steps}`).join(" → ");
  function stageAt(schedule, step) {
    const st = stages(schedule);
    let idx = 0;
    st.forEach((s, i) => { if (step >= s.first) idx = i; });
    return st.length ? { index: idx, n: st[idx].n } : null;
  }

  return { api, getJSON, requireKey, followMetrics, el, fmt, fmtTime, statusPill, TERMINAL,
           stages, scheduleText, stageAt, ApiError };
})();
