// The job page's samples table: what the model wrote at a step (GET /v1/jobs/{id}/samples),
// with a step selector and a reward filter. A rising reward whose completions read wrong is
// reward hacking; this table is where a user sees it. A multi-turn sample (`task.env`) shows
// its transcript turn by turn in the last column: the opening messages, each model turn with
// the tool calls it made (arguments included), each tool result (failed ones highlighted),
// and the episode's reward.
//
// Everything in a sample was written by the model or by the tenant's environment: it only
// ever reaches the page as text (`el`'s `text`, i.e. textContent), never as markup.
"use strict";
window.SamplesTable = (jobId) => {
  const { getJSON, el, fmt } = Brorl;
  const stepSel = document.getElementById("samples-step");
  const filter = document.getElementById("samples-filter");
  const threshold = document.getElementById("samples-threshold");
  const body = document.querySelector("#samples tbody");
  const lastHead = document.querySelector("#samples thead th:last-child");
  const note = document.getElementById("samples-note");
  let following = true; // the selector follows the newest step until the user picks one
  let loading = Promise.resolve();

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  // A tool call's arguments, pretty-printed when they are JSON (the model's raw text if not).
  function argsText(args) {
    try { return JSON.stringify(JSON.parse(args), null, 1).replace(/\n\s*/g, " "); } catch (_) { return args; }
  }

  function toolCall(c) {
    return el("div", { class: "tool-call" },
      el("span", { class: "tool-name", text: `→ ${c.function.name || "(no name)"}` }),
      el("code", { class: "tool-args", text: argsText(c.function.arguments) }),
      c.id ? el("span", { class: "muted", text: ` ${c.id}` }) : null);
  }

  // A failed call or action: marked by the environment (`error: true`), or answered the way the
  // built-in tools and OpenEnv servers answer one (text starting "error:"; verifiers' "Error:").
  const failed = (m, turn) => m.error === true ||
    (turn > 0 && m.role !== "assistant" && /^error:/i.test(m.content || ""));

  function message(m, turn) {
    const bad = failed(m, turn);
    const head = [el("span", { class: "turn-role", text: m.role })];
    if (m.role === "assistant") head.push(el("span", { class: "muted", text: ` turn ${turn}` }));
    if (m.role === "tool") {
      head.push(el("span", { class: "muted", text: ` ${m.name || ""}${m.tool_call_id ? ` ← ${m.tool_call_id}` : ""}` }));
    }
    if (bad) head.push(el("span", { class: "turn-error-label", text: " error" }));
    return el("div", { class: `turn turn-${/^[a-z]+$/.test(m.role) ? m.role : "other"}${bad ? " turn-error" : ""}`,
                       "data-role": m.role },
      el("div", { class: "turn-head" }, ...head),
      m.content ? el("pre", { class: "sample-text", text: m.content }) : null,
      ...(m.tool_calls || []).map(toolCall));
  }

  function transcript(s) {
    let turn = 0;
    const counts = el("div", { class: "turn-counts" },
      plural(s.turns ?? 0, "turn"), " · ", plural(s.tool_calls ?? 0, "tool call"), " · ",
      el("span", { class: s.tool_errors ? "error" : "", text: plural(s.tool_errors ?? 0, "tool error") }));
    return el("div", { class: "transcript" }, counts,
      ...s.messages.map((m) => message(m, m.role === "assistant" ? ++turn : turn)),
      s.messages_dropped ? el("div", { class: "muted", text: `${plural(s.messages_dropped, "later message")} not stored (size cap)` }) : null,
      s.env_error ? el("div", { class: "turn turn-error env-error" },
        el("div", { class: "turn-head" }, el("span", { class: "turn-error-label", text: "the environment broke the episode" })),
        el("pre", { class: "sample-text", text: s.env_error })) : null,
      el("div", { class: "turn turn-reward" }, `reward ${fmt(s.reward)}`, s.correct ? " ✓" : " ✗",
        s.truncated ? " · cut by the token budget" : ""));
  }

  const row = (s) => el("tr", { class: s.correct ? "sample-correct" : "sample-wrong", "data-idx": s.idx },
    el("td", { text: s.idx }), el("td", { text: fmt(s.reward) }), el("td", { text: fmt(s.advantage) }),
    el("td", { text: s.truncated ? "cut" : "" }),
    el("td", { text: Object.entries(s.sub_rewards).map(([k, x]) => `${k}=${fmt(x)}`).join(" ") }),
    el("td", {}, el("pre", { class: "sample-text", text: s.prompt })),
    el("td", {}, s.messages ? transcript(s) : el("pre", { class: "sample-text", text: s.completion })));

  async function load() {
    const step = stepSel.value;
    if (!step) { note.textContent = "no samples stored yet"; return; }
    const t = Number(threshold.value);
    const q = filter.value === "high" ? `&min_reward=${t}` : filter.value === "low" ? `&max_reward=${t}` : "";
    const page = await getJSON(`/v1/jobs/${jobId}/samples?step=${step}&limit=64${q}`);
    body.replaceChildren(...page.data.map(row));
    lastHead.textContent = page.data.some((s) => s.messages) ? "transcript (turn by turn)" : "completion";
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
