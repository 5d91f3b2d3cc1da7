// Compare page (`/compare`): 2-4 jobs, one metric, overlaid on one x axis (step, samples or
// seconds); each job's broadening schedule is in its legend entry. Refreshed while any runs.
"use strict";
(() => {
  const { getJSON, el, scheduleText, TERMINAL } = Brorl;
  const MAX = 4;
  const cache = new Map(); // job id -> {job, rows}
  let u = null, mode = "step", timer = null;

  async function loadRows(id) {
    const rows = [];
    let after = null;
    for (;;) {
      const page = await getJSON(`/v1/jobs/${id}/metrics?limit=10000${after != null ? `&after_step=${after}` : ""}`);
      rows.push(...page.data);
      if (!page.has_more || !page.data.length) return rows;
      after = page.data[page.data.length - 1].step;
    }
  }

  const selected = () => Array.from(document.querySelectorAll("#pick input:checked")).map((i) => i.value);

  function metricNames() {
    const names = new Set();
    for (const { rows } of cache.values()) for (const r of rows) Object.keys(r.values).forEach((k) => names.add(k));
    return Array.from(names).sort();
  }

  async function refresh() {
    clearTimeout(timer);
    const ids = selected();
    const msg = document.getElementById("compare-msg");
    document.querySelectorAll("#pick input").forEach((i) => { i.disabled = !i.checked && ids.length >= MAX; });
    if (ids.length < 2) {
      msg.textContent = "Pick at least two jobs.";
      if (u) { u.destroy(); u = null; }
      document.getElementById("compare-chart").dataset.jobs = "0";
      return;
    }
    msg.textContent = "";
    for (const id of ids) cache.set(id, { job: await getJSON(`/v1/jobs/${id}`), rows: await loadRows(id) });
    const select = document.getElementById("metric");
    const current = select.value || "reward_mean";
    select.replaceChildren(...metricNames().map((n) => el("option", { value: n, text: n, selected: n === current })));
    draw(ids, select.value);
    if (ids.some((id) => !TERMINAL.includes(cache.get(id).job.status))) timer = setTimeout(refresh, 8000);
  }

  function draw(ids, metric) {
    const box = document.getElementById("compare-chart");
    const tables = ids.map((id) => {
      const { job, rows } = cache.get(id);
      const xs = Charts.xValues(rows, mode, job.started_at ? Date.parse(job.started_at) : null);
      const ys = rows.map((r) => (typeof r.values[metric] === "number" ? r.values[metric] : null));
      // uPlot.join needs ascending, distinct x: keep the last row of any repeated x.
      const px = [], py = [];
      xs.forEach((x, i) => {
        if (px.length && x <= px[px.length - 1]) { px.pop(); py.pop(); }
        px.push(x); py.push(ys[i]);
      });
      return [px, py];
    });
    const data = uPlot.join(tables);
    const series = [{ label: Charts.X_LABELS[mode] }, ...ids.map((id, i) => {
      const { job } = cache.get(id);
      return { label: `${job.name} (${scheduleText(job.overview.schedule)})`, stroke: Charts.PALETTE[i],
               width: 2, spanGaps: true, points: { show: false } };
    })];
    if (u) u.destroy();
    u = new uPlot({ title: metric, width: Math.max(box.clientWidth - 10, 300), height: 360,
                    scales: { x: { time: false, range: Charts.xRange }, y: { range: Charts.yRange } }, series,
                    axes: [{ label: Charts.X_LABELS[mode] }, { label: metric, size: 60 }] }, data, box);
    box.dataset.jobs = String(ids.length);
    box.dataset.metric = metric;
  }

  async function start() {
    const page = await getJSON("/v1/jobs?limit=100");
    const pick = document.getElementById("pick");
    const want = new URLSearchParams(location.search).getAll("job");
    pick.replaceChildren(...page.data.map((j) => el("label", {},
      el("input", { type: "checkbox", value: j.id, checked: want.includes(j.id), onchange: refresh }),
      ` ${j.name} · ${scheduleText(j.overview.schedule)} · ${j.status}`)));
    if (!page.data.length) pick.append("No jobs yet.");
    document.getElementById("metric").addEventListener("change", (e) => draw(selected(), e.target.value));
    document.querySelectorAll("input[name=xaxis]").forEach((r) => r.addEventListener("change", () => {
      mode = r.value;
      if (selected().length >= 2) draw(selected(), document.getElementById("metric").value);
    }));
    new ResizeObserver(() => {
      const box = document.getElementById("compare-chart");
      if (u) u.setSize({ width: Math.max(box.clientWidth - 10, 300), height: 360 });
    }).observe(document.getElementById("compare-chart"));
    refresh();
  }

  Brorl.requireKey(start);
})();
