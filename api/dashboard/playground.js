// Grader playground on the submit page: a grader, a sample and an item go to
// POST /v1/graders/run; the reward, each multi sub-reward and the error flags come back.
// The grader never runs here: the server grades (python and code graders in its sandbox).
"use strict";
(() => {
  const { api, el, fmt } = Brorl;
  const $ = (id) => document.getElementById(id);

  const EXAMPLE = {
    grader: {
      type: "multi", name: "answer and format", calculate_output: "0.8 * right + 0.2 * tagged",
      graders: {
        right: { type: "python", name: "right answer", source:
          "import re\n\ndef grade(sample, item):\n" +
          "    m = re.search(r\"<answer>(.*?)</answer>\", sample[\"output_text\"])\n" +
          "    return float(m is not None and m.group(1).strip() == str(item[\"answer\"]))\n" },
        tagged: { type: "string_check", name: "uses the tags", input: "{{ sample.output_text }}",
                  reference: "<answer>", operation: "like" },
      },
    },
    sample: "2 + 3 is <answer>5</answer>",
    item: { prompt: "2 + 3 = ?", answer: "5" },
  };

  function loadExample() {
    $("pg-grader").value = JSON.stringify(EXAMPLE.grader, null, 2);
    $("pg-sample").value = EXAMPLE.sample;
    $("pg-item").value = JSON.stringify(EXAMPLE.item, null, 2);
  }

  /** The request body, or throws an Error naming the box that does not parse. */
  function body() {
    let grader, item;
    try { grader = jsyaml.load($("pg-grader").value); } catch (e) { throw new Error(`grader: ${e.message}`); }
    if (grader === null || typeof grader !== "object" || Array.isArray(grader)) throw new Error("grader: must be an object");
    const itemText = $("pg-item").value.trim() || "{}";
    try { item = JSON.parse(itemText); } catch (e) { throw new Error(`item: not JSON (${e.message})`); }
    if (item === null || typeof item !== "object" || Array.isArray(item)) throw new Error("item: must be a JSON object");
    return { grader, model_sample: $("pg-sample").value, item };
  }

  function show(result) {
    $("pg-reward").textContent = fmt(result.reward, 4);
    $("pg-reward").dataset.reward = String(result.reward);
    $("pg-time").textContent = `(${fmt(result.metadata.execution_time, 3)} s)`;
    const subs = Object.entries(result.sub_rewards || {});
    $("pg-subs").hidden = subs.length === 0;
    $("pg-subs").querySelector("tbody").replaceChildren(...subs.map(([k, r]) =>
      el("tr", { "data-key": k }, el("td", { text: k }), el("td", { text: fmt(r, 4), "data-reward": String(r) }))));
    const errors = result.metadata.errors || {};
    const raised = Object.keys(errors).filter((k) => errors[k] === true);
    $("pg-errors").replaceChildren(raised.length
      ? el("span", { class: "error" }, "errors: ", ...raised.map((k) => el("code", { class: "pg-flag", "data-flag": k, text: k + " " })))
      : el("span", { class: "muted", text: "no errors" }));
    const details = errors.python_grader_runtime_error_details;
    $("pg-details").hidden = !details;
    $("pg-details").textContent = details || "";
    $("pg-result").hidden = false;
  }

  async function run() {
    $("pg-msg").textContent = "";
    $("pg-result").hidden = true;
    let request;
    try { request = body(); } catch (e) { $("pg-msg").textContent = e.message; return; }
    $("pg-run").disabled = true;
    try {
      show(await (await api("/v1/graders/run", { method: "POST", json: request })).json());
    } catch (e) {
      $("pg-msg").textContent = `${e.status || ""} ${e.type || "error"}: ${e.message}`;
      if (e.field) $("pg-msg").dataset.field = e.field;
    } finally {
      $("pg-run").disabled = false;
    }
  }

  Brorl.requireKey(() => {
    $("pg-example").addEventListener("click", loadExample);
    $("pg-run").addEventListener("click", run);
  });
})();
