// Webhooks (`/webhooks`): register endpoints, see each one's delivery log, rotate its secret,
// send a test, retry a failed delivery, delete it. Everything goes through /v1/webhooks.
"use strict";
(() => {
  const { api, getJSON, el, fmtTime, statusPill } = Brorl;
  const EVENTS = ["job.succeeded", "job.failed", "job.cancelled", "job.paused", "job.warning",
                  "job.checkpoint_saved"];
  const $ = (id) => document.getElementById(id);
  let shown = null; // the endpoint whose log is open

  function showSecret(endpoint) {
    $("wh-secret-id").textContent = endpoint.id;
    $("wh-secret-value").textContent = endpoint.secret;
    $("wh-secret").hidden = false;
  }

  async function act(path, method = "POST") {
    const r = await api(path, { method });
    return r.status === 204 ? null : r.json();
  }

  function endpointRow(e) {
    const buttons = el("td", {},
      el("button", { text: "log", onclick: () => openLog(e) }),
      el("button", { text: "test", onclick: async () => { await act(`/v1/webhooks/${e.id}/test`); openLog(e); } }),
      el("button", { text: "rotate secret", onclick: async () => showSecret(await act(`/v1/webhooks/${e.id}/rotate`)) }),
      el("button", { text: "delete", onclick: async () => {
        await act(`/v1/webhooks/${e.id}`, "DELETE");
        if (shown && shown.id === e.id) { shown = null; $("wh-log").hidden = true; }
        refresh();
      } }));
    return el("tr", { "data-endpoint": e.id },
      el("td", { text: e.url }), el("td", { text: (e.event_types || ["all"]).join(", ") }),
      el("td", { text: e.enabled ? "yes" : "no" }), el("td", { text: fmtTime(e.created_at) }), buttons);
  }

  function deliveryRow(e, d) {
    const answer = d.last_error || (d.last_status_code ? String(d.last_status_code) : "");
    const retry = d.status === "failed"
      ? el("button", { text: "retry", onclick: async () => { await act(`/v1/webhooks/${e.id}/deliveries/${d.id}/retry`); openLog(e); } })
      : null;
    return el("tr", { "data-delivery": d.id },
      el("td", { text: d.event_type }), el("td", {}, statusPill(d.status)), el("td", { text: String(d.attempts) }),
      el("td", { text: answer }), el("td", { text: fmtTime(d.created_at) }), el("td", {}, retry));
  }

  async function openLog(e) {
    shown = e;
    const page = await getJSON(`/v1/webhooks/${e.id}/deliveries?limit=50`);
    $("wh-log-url").textContent = e.url;
    $("wh-deliveries").querySelector("tbody").replaceChildren(...page.data.map((d) => deliveryRow(e, d)));
    $("wh-log").hidden = false;
  }

  async function refresh() {
    const page = await getJSON("/v1/webhooks");
    $("wh-endpoints").querySelector("tbody").replaceChildren(...page.data.map(endpointRow));
    $("wh-empty").hidden = page.data.length > 0;
    if (shown) openLog(shown);
  }

  async function create(ev) {
    ev.preventDefault();
    $("wh-msg").textContent = "";
    const ticked = [...$("wh-events").querySelectorAll("input:checked")].map((i) => i.value);
    try {
      const r = await api("/v1/webhooks", { method: "POST",
        json: { url: $("wh-url").value, event_types: ticked.length ? ticked : null } });
      showSecret(await r.json());
      $("wh-url").value = "";
      refresh();
    } catch (e) {
      $("wh-msg").textContent = e.message;
    }
  }

  Brorl.requireKey(() => {
    $("wh-events").append(...EVENTS.map((t) => el("label", {}, el("input", { type: "checkbox", value: t }), ` ${t}`)));
    $("wh-form").addEventListener("submit", create);
    refresh();
    setInterval(() => { if (shown) openLog(shown); }, 3000); // deliveries land in the background
  });
})();
