"""The browser dashboard: seven static pages and their assets, served by the API itself.

The pages (`/`, `/jobs/{id}`, `/compare`, `/submit`, `/probes/{id}`, `/evaluations/{id}`, `/webhooks`) are one shell (`dashboard/shell.html`)
around each page's body (`dashboard/pages/`); their scripts talk to the public `/v1` API with the key the user typed
(kept in the tab's sessionStorage and sent as the bearer header), exactly like any other
client, so there is no server-side session and no route here that reads data. Everything,
the chart library included (`dashboard/vendor/`), is served from the package: the dashboard
and `/docs` work on a machine without internet.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DASHBOARD_DIR = Path(__file__).resolve().parent / "dashboard"
STATIC_PREFIX = "/static"

# Only our own origin: no CDN, no inline script (the key lives in this origin's storage, so
# an injected script is what must never run). uPlot sizes its canvases through style
# attributes, hence 'unsafe-inline' for styles only.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; "
       "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "Referrer-Policy": "no-referrer",
                "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


# url -> (page name: pages/<name>.html is its body, title, its scripts after the shared ones)
PAGES = {"/": ("index", "Jobs", ("list.js",)),
         "/jobs/{job_id}": ("job", "Job", ("samples.js", "job.js", "tryit.js", "continue.js", "evaluate.js")),
         "/compare": ("compare", "Compare", ("compare.js",)), "/submit": ("submit", "Submit", ("submit.js", "playground.js")),
         "/probes/{probe_id}": ("probe", "Probe", ("probe.js",)),
         "/evaluations/{evaluation_id}": ("evaluation", "Evaluation", ("evaluation.js",)),
         "/webhooks": ("webhooks", "Webhooks", ("webhooks.js",))}


def render_page(name: str, title: str, scripts: tuple[str, ...]) -> str:
    """One page: the shared shell (head, navigation, key form, scripts) around its body."""
    shell = Template((DASHBOARD_DIR / "shell.html").read_text())
    nav = {f"nav_{n}": 'aria-current="page"' if n == name else "" for n in ("index", "compare", "submit", "webhooks")}
    body = (DASHBOARD_DIR / "pages" / f"{name}.html").read_text()
    tags = "".join(f'  <script src="{STATIC_PREFIX}/{s}"></script>\n' for s in scripts)
    return shell.substitute(title=title, body=body, scripts=tags, **nav)


def _page(html: str, name: str):
    def page() -> HTMLResponse:
        return HTMLResponse(html, headers=PAGE_HEADERS)

    page.__name__ = f"dashboard_{name}"
    return page


def install_dashboard(app: FastAPI) -> None:
    """Mount the dashboard pages and their static files on `app` (not in the OpenAPI schema)."""
    for url, (name, title, scripts) in PAGES.items():
        # Rendered once per app: the files ship with the package and do not change under it.
        app.add_api_route(url, _page(render_page(name, title, scripts), name), methods=["GET"],
                          include_in_schema=False)
    app.mount(STATIC_PREFIX, StaticFiles(directory=DASHBOARD_DIR), name="dashboard-static")
