// The job page's lineage and "continue" buttons: where this job was continued from, the jobs
// that continue it, and a new job from its newest checkpoint (as it was, or broad: n x 4 up to
// 512 at the job's own lr rule), opened in the submit page to review (docs/probe.md).
"use strict";
(() => {
  const { getJSON, el } = Brorl;
  const jobId = decodeURIComponent(location.pathname.split("/").pop());
  const $ = (id) => document.getElementById(id);
  const link = (id) => el("a", { href: `/jobs/${id}`, text: id });

  async function lineage() {
    let job, kids, ckpts;
    try {
      [job, kids, ckpts] = await Promise.all([getJSON(`/v1/jobs/${jobId}`),
        getJSON(`/v1/jobs/${jobId}/continuations`), getJSON(`/v1/jobs/${jobId}/checkpoints`)]);
    } catch (_) { return; }  // a page being left aborts these; the job page shows the job's own errors
    const parts = [];
    if (job.parent_job_id) {
      parts.push("continued from ", link(job.parent_job_id), ` (step ${job.spec.continue_from.step})`);
    }
    if (kids.data.length) {
      if (parts.length) parts.push("; ");
      parts.push("continued by ");
      kids.data.forEach((k, i) => parts.push(...(i ? [", "] : []), link(k.id)));
    }
    $("job-lineage").replaceChildren(...parts);
    $("job-lineage").hidden = parts.length === 0;
    $("continue-row").hidden = ckpts.data.length === 0;
  }

  async function openContinuation(broad) {
    try {
      const { spec } = await getJSON(`/v1/jobs/${jobId}/continuation?broad=${broad}`);
      delete spec.model; // the parent's, filled in by the service
      sessionStorage.setItem("brorl.submitPrefill", jsyaml.dump(spec, { sortKeys: false }));
      location.assign("/submit");
    } catch (e) {
      $("continue-msg").textContent = e.message;
    }
  }

  Brorl.requireKey(() => {
    $("continue-narrow").addEventListener("click", () => openContinuation(false));
    $("continue-broad").addEventListener("click", () => openContinuation(true));
    // After the page's own first burst of requests (the per-key rate limit counts them all),
    // then every 10 s: a first checkpoint, or a new continuation, shows up.
    setTimeout(lineage, 2000);
    setInterval(lineage, 10000);
  });
})();
