// Submit page (`/submit`): a YAML / JSON spec from the template, a file or the keyboard;
// parsed in the browser (js-yaml), POSTed as JSON; the API's 422 errors are shown next to
// the field they name in an outline of the spec; success lands on the job page. "Probe first"
// sends the spec's model and task to /v1/probes instead; a probe page can prefill the box.
"use strict";
(() => {
  const { api, el } = Brorl;
  const text = () => document.getElementById("spec-text");

  /** [{field, message}] from the API's error ("a.b: msg; c: msg2", field = the first). */
  function splitErrors(err) {
    const items = [];
    for (const part of (err.message || "").split(/; (?=[\w.@\[\]-]+: )/)) {
      const m = part.match(/^([\w.@\[\]-]+): ([\s\S]*)$/);
      items.push(m ? { field: m[1], message: m[2] } : { field: err.field || "", message: part });
    }
    return items;
  }

  // The spec as nested rows, each tagged with its dotted path (data-field), so an error can
  // sit beside the field it names (or its nearest parent if the field is missing).
  function outline(value, path, into) {
    if (value !== null && typeof value === "object") {
      for (const [k, child] of Object.entries(value)) {
        const p = path ? `${path}.${k}` : k;
        const leaf = child === null || typeof child !== "object";
        const row = el("div", { "data-field": p },
          el("span", { class: "key", text: `${k}:` }), leaf ? ` ${JSON.stringify(child)}` : null);
        into.append(row);
        if (!leaf) outline(child, p, row);
      }
    }
  }

  function showErrors(spec, items) {
    const box = document.getElementById("outline");
    box.replaceChildren();
    outline(spec, "", box);
    for (const { field, message } of items) {
      let parts = field.split("."), target = null;
      while (parts.length && !(target = box.querySelector(`[data-field="${CSS.escape(parts.join("."))}"]`))) parts.pop();
      const note = el("span", { class: "field-error", "data-for": field,
                                text: `← ${parts.join(".") === field ? "" : `${field}: `}${message}` });
      if (target) {
        target.classList.add("has-error");
        const key = target.querySelector(":scope > .key");
        (target.childNodes[1] && target.childNodes[1].nodeType === 3 ? target.childNodes[1] : key).after(note);
      } else box.prepend(el("div", { class: "has-error" }, note));
    }
    box.hidden = false;
    const first = box.querySelector(".has-error");
    if (first) first.scrollIntoView({ block: "center" });
  }

  async function submit() {
    const msg = document.getElementById("submit-msg");
    msg.textContent = "";
    document.getElementById("outline").hidden = true;
    let spec;
    try {
      spec = jsyaml.load(text().value);
    } catch (e) {
      msg.textContent = `not valid YAML/JSON: ${e.message}`;
      return;
    }
    if (spec === null || typeof spec !== "object" || Array.isArray(spec)) {
      msg.textContent = "the spec must be a mapping (YAML) or an object (JSON)";
      return;
    }
    try {
      const job = await (await api("/v1/jobs", { method: "POST", json: spec })).json();
      location.assign(`/jobs/${job.id}`);
    } catch (e) {
      msg.textContent = `${e.status || ""} ${e.type || "error"}: ${e.message}`;
      if (e.status === 422) showErrors(spec, splitErrors(e));
    }
  }

  /** The spec in the box, parsed; null (with the message shown) when it is not a mapping. */
  function parsed() {
    const msg = document.getElementById("submit-msg");
    msg.textContent = "";
    try {
      const spec = jsyaml.load(text().value);
      if (spec !== null && typeof spec === "object" && !Array.isArray(spec)) return spec;
      msg.textContent = "the spec must be a mapping (YAML) or an object (JSON)";
    } catch (e) {
      msg.textContent = `not valid YAML/JSON: ${e.message}`;
    }
    return null;
  }

  /** 4 s, 3 min 20 s, 2 h 05 min (as the CLI writes it). */
  function duration(sec) {
    const s = Math.round(sec), pad = (x) => String(x).padStart(2, "0");
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${pad(s % 60)} s`;
    return `${Math.floor(s / 3600)} h ${pad(Math.floor((s % 3600) / 60))} min`;
  }

  // "Estimate": the same checks as a submission, nothing stored (POST /v1/jobs?dry_run=true).
  function estimateLines(e) {
    const n = (x) => Number(x).toLocaleString("en"), w = e.wall_time, m = e.memory;
    const fit = { true: "fits", false: "does not fit", null: "not checked" }[String(m.fits)];
    return [
      ...e.stages.map((s) => `stage ${s.stage}: ${s.steps} steps × ${s.prompts_per_step} prompts × n=${s.n} = ${n(s.samples)} samples`),
      `evaluation: ${e.evaluation.count} × ${e.evaluation.prompts} prompts × ${e.evaluation.samples_per_prompt} = ${n(e.evaluation.samples)} samples`,
      `in all: ${n(e.samples)} samples, at most ${n(e.response_tokens_max)} response tokens (${e.tokens_note})`,
      `wall time: about ${duration(w.seconds)}. ${w.derivation}`,
      w.past_accuracy.jobs ? `past jobs: actual / estimate, median ${w.past_accuracy.median_actual_over_estimate} over ${w.past_accuracy.jobs}` : "past jobs: none to compare with yet",
      m.total_gb === null ? `memory: ${m.note}` : `memory: ${m.total_gb} GiB per rank${m.worker_gb ? ` of ${m.worker_gb} GiB` : ""}: ${fit}. ${m.note}`,
      `queue: ${e.queued_ahead} job(s) queued on ${e.multi_node ? "the multi-node queue" : `the ${e.gpus}-GPU queue`} now`,
    ];
  }

  async function estimate() {
    const spec = parsed();
    const box = document.getElementById("estimate-box");
    box.hidden = true;
    document.getElementById("outline").hidden = true;
    if (!spec) return;
    try {
      const e = await (await api("/v1/jobs?dry_run=true", { method: "POST", json: spec })).json();
      document.getElementById("estimate-lines").replaceChildren(
        ...estimateLines(e).map((t) => el("li", { text: t })));
      box.classList.toggle("has-error", e.fits === false);
      box.hidden = false;
    } catch (e) {
      document.getElementById("submit-msg").textContent = `${e.status || ""} ${e.type || "error"}: ${e.message}`;
      if (e.status === 422) showErrors(spec, splitErrors(e));
    }
  }

  // "Probe first": the spec's model on its task, sampled at its rollout settings (docs/probe.md).
  async function probeFirst() {
    const spec = parsed();
    if (!spec) return;
    const r = spec.rollout || {};
    const body = { model: spec.model, task: spec.task, seed: spec.seed, max_new_tokens: r.max_new_tokens,
                   temperature: r.temperature, top_p: r.top_p, engine: r.engine };
    for (const k of Object.keys(body)) if (body[k] === undefined) delete body[k];
    try {
      const probe = await (await api("/v1/probes", { method: "POST", json: body })).json();
      location.assign(`/probes/${probe.id}`);
    } catch (e) {
      document.getElementById("submit-msg").textContent = `${e.status || ""} ${e.type || "error"}: ${e.message}`;
    }
  }

  Brorl.requireKey(() => {
    // A probe page's "open the recommended job" leaves its spec here for one visit.
    const prefill = sessionStorage.getItem("brorl.submitPrefill");
    if (prefill) {
      text().value = prefill;
      sessionStorage.removeItem("brorl.submitPrefill");
    }
    document.getElementById("probe-first").addEventListener("click", probeFirst);
    document.getElementById("estimate").addEventListener("click", estimate);
    document.getElementById("template").addEventListener("click", async () => {
      text().value = await (await fetch("/static/template.yaml")).text();
    });
    document.getElementById("upload").addEventListener("change", async (ev) => {
      const f = ev.target.files[0];
      if (f) text().value = await f.text();
    });
    document.getElementById("submit").addEventListener("click", submit);
  });
})();
