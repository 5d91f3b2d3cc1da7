// The job page's "try it" box: send a message to one of the job's checkpoints through the
// OpenAI-compatible /v1/chat/completions (docs/inference.md) and show the answer as it streams.
"use strict";
(() => {
  const { api, getJSON, el } = Brorl;
  const jobId = decodeURIComponent(location.pathname.split("/").pop());
  const $ = (id) => document.getElementById(id);

  async function fillCheckpoints() {
    const select = $("tryit-model");
    const chosen = select.value;
    let steps = [];
    try {
      steps = (await getJSON(`/v1/jobs/${jobId}/checkpoints`)).data.map((c) => c.step).reverse();
    } catch (_) { return; }  // the job page shows the job's own errors
    select.replaceChildren(...(steps.length ? [el("option", { value: jobId }, "newest checkpoint")] : []),
      ...steps.map((s) => el("option", { value: `${jobId}:${s}` }, `step ${s}`)));
    if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
    $("tryit-send").disabled = !steps.length;
    $("tryit-msg").textContent = steps.length ? "" : "no checkpoint yet";
  }

  // The SSE body, one `data:` event at a time, until `data: [DONE]`.
  async function* events(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") return;
        yield JSON.parse(line.slice(6));
      }
    }
  }

  async function send(ev) {
    ev.preventDefault();
    const answer = $("tryit-answer"), msg = $("tryit-msg"), button = $("tryit-send");
    answer.textContent = "";
    answer.dataset.done = "false";
    msg.textContent = "";
    button.disabled = true;
    const body = {
      model: $("tryit-model").value, stream: true,
      messages: [{ role: "user", content: $("tryit-prompt").value }],
      max_tokens: Number($("tryit-max").value), temperature: Number($("tryit-temp").value),
    };
    try {
      const response = await api("/v1/chat/completions", { method: "POST", json: body });
      for await (const chunk of events(response)) {
        if (chunk.error) throw new Error(chunk.error.message);
        const choice = chunk.choices[0];
        if (choice && choice.delta.content) answer.textContent += choice.delta.content;
        if (choice && choice.finish_reason) answer.dataset.finish = choice.finish_reason;
      }
      answer.dataset.done = "true";
    } catch (err) {
      msg.textContent = err.status ? `${err.status}: ${err.message}` : err.message;
    } finally {
      button.disabled = false;
    }
  }

  $("tryit").addEventListener("submit", send);
  $("tryit-model").addEventListener("focus", fillCheckpoints);
  fillCheckpoints();
})();
