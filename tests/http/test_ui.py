"""Paths outside /api/: the web UI's files, index.html for app routes, or how to build it."""

from __future__ import annotations

import time
from pathlib import Path

from assay.master.store import LogLine
from tests.http.conftest import Site, open_site, wait_for
from tests.http.test_logs_follow import EventReader


def test_without_a_build_every_page_says_how_to_build_it(tmp_path: Path) -> None:
    site = open_site(tmp_path / "master", ui_dir=tmp_path / "no-build")
    try:
        _says_how_to_build(site)
    finally:
        site.close()


def _says_how_to_build(site: Site) -> None:
    for path in ("/", "/experiments/3", "/cluster"):
        reply = site.get(path)
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/html")
        page = reply.body.decode()
        assert "cd webui &amp;&amp; npm ci &amp;&amp; npm run build" in page
        assert "not built" in page


def test_a_build_is_served_with_index_html_for_app_routes(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<!doctype html><div id=root></div>")
    (dist / "assets" / "app-1234.js").write_text("console.log('assay')")
    (tmp_path / "secret.txt").write_text("not for the web")
    site = open_site(tmp_path / "master", ui_dir=dist)
    try:
        root = site.get("/")
        assert root.status == 200
        assert root.body == b"<!doctype html><div id=root></div>"
        script = site.get("/assets/app-1234.js")
        assert script.status == 200
        assert script.body == b"console.log('assay')"
        assert "javascript" in script.headers["Content-Type"]
        for route in ("/experiments/12", "/trials/3", "/cluster", "/experiments/12/"):
            again = site.get(route)
            assert again.status == 200, route
            assert again.body == root.body, route
        assert site.get("/assets/missing-999.js").status == 404
        for escape in ("/../secret.txt", "/%2e%2e/secret.txt", "/assets/..%2f..%2fsecret.txt"):
            reply = site.get(escape)
            assert b"not for the web" not in reply.body, escape
        assert site.get("/api/v1/health").json() == {"status": "ok"}
        assert site.get("/api/v1/unknown").status == 404
    finally:
        site.close()


def test_stopping_the_server_ends_open_log_streams(site: Site) -> None:
    eid = site.create(activate=True)
    store = site.master.store
    wait_for(lambda: bool(store.list_trials(eid)))
    trial = store.list_trials(eid)[0]
    store.append_logs(trial.id, trial.run_id, [LogLine("hello")])
    reader = EventReader(site, f"/api/v1/trials/{trial.id}/logs?follow=true")
    assert reader.next() is not None
    started = time.monotonic()
    site.master.loop.call(site.server.stop)
    assert time.monotonic() - started < 3.0
    assert reader.next() is None
    assert site.server.followers == 0
    reader.close()
