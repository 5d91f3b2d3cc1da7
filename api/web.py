"""The browser dashboard: four static pages and their assets, served by the API itself.

The pages (`/`, `/jobs/{id}`, `/compare`, `/submit`) are plain HTML files in
`api/dashboard/`; their scripts talk to the public `/v1` API with the key the user typed
(kept in the tab's sessionStorage and sent as the bearer header), exactly like any other
client, so there is no server-side session and no route here that reads data. Everything,
the chart library included (`dashboard/vendor/`), is served from the package: the dashboard
and `/docs` work on a machine without internet.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
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


def _page(name: str):
    path = DASHBOARD_DIR / name

    def page() -> FileResponse:
        return FileResponse(path, media_type="text/html", headers=PAGE_HEADERS)

    page.__name__ = f"dashboard_{path.stem}"
    return page


def install_dashboard(app: FastAPI) -> None:
    """Mount the dashboard pages and their static files on `app` (not in the OpenAPI schema)."""
    for url, name in (("/", "index.html"), ("/jobs/{job_id}", "job.html"),
                      ("/compare", "compare.html"), ("/submit", "submit.html")):
        app.add_api_route(url, _page(name), methods=["GET"], include_in_schema=False)
    app.mount(STATIC_PREFIX, StaticFiles(directory=DASHBOARD_DIR), name="dashboard-static")
