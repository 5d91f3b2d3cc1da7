// The job page's samples table: what the model wrote at a step (GET /v1/jobs/{id}/samples),
// with a step selector and a reward filter. A rising reward whose completions read wrong is
// reward hacking; this table is where a user sees it.
"use strict";
window.SamplesTable = (jobId) => {
  const { getJSON, el, fmt } = Brorl;
  const stepSel = document.getElementById("samples-step");
  const filter = document.getElementById("samples-filter");
  const threshold = document.getElementById("samples-threshold");
  const body = document.querySelector("#samples tbody");
  const note = document.getElementById("samples-note");
  let following = true; // the selector follows the newest step until the user picks one
  let loading = Promise.resolve();

  const row = (s) => el("tr", { class: s.correct ? "sample-correct" : "sample-wrong" },
    el("td", { text: s.idx }), el("td", { text: fmt(s.reward) }), el("td", { text: fmt(s.advantage) }),
    el("td", { text: s.truncated ? "cut" : "" }),
    el("td", { text: Object.entries(s.sub_rewards).map(([k, x]) => `${k}=${fmt(x)}`).join(" ") }),
    el("td", {}, el("pre", { class: "sample-text", text: s.prompt })),
    el("td", {}, el("pre", { class: "sample-text", text: s.completion })));

  async function load() {
    const step = stepSel.value;
    if (!step) { note.textContent = "no samples stored yet"; return; }
    const t = Number(threshold.value);
    const q = filter.value === "high" ? `&min_reward=${t}` : filter.value === "low" ? `&max_reward=${t}` : "";
    const page = await getJSON(`/v1/jobs/${jobId}/samples?step=${step}&limit=64${q}`);
    body.replaceChildren(...page.data.map(row));
    note.textContent = `${page.data.length} sample(s) at step ${step}`;
  }
  const reload = () => { loading = loading.then(load, load); return loading; };

  stepSel.addEventListener("change", () => { following = stepSel.selectedIndex === 0; reload(); });
  filter.addEventListener("change", reload);
  threshold.addEventListener("change", reload);

  // Called with each metric row as it streams in (step 0 is the evaluation before training).
  return function addStep(step) {
    if (step < 1 || stepSel.querySelector(`option[value="${step}"]`)) return;
    stepSel.prepend(el("option", { value: step, text: `step ${step}` }));
    if (following) { stepSel.selectedIndex = 0; reload(); }
  };
};
