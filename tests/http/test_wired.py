"""The master serves the HTTP API next to gRPC, on the port its config names."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from assay.master._server import MasterServer
from tests.credentials import login, master_config


def test_a_master_serves_the_http_api_on_its_http_port(tmp_path: Path) -> None:
    server = MasterServer(
        master_config(
            state_dir=tmp_path,
        )
    )
    server.start()
    try:
        assert server.http_port not in (0, server.port)
        base = f"http://127.0.0.1:{server.http_port}/api/v1"
        with urllib.request.urlopen(f"{base}/health", timeout=10) as reply:
            assert json.loads(reply.read()) == {"status": "ok"}
        token = login(f"127.0.0.1:{server.port}")
        request = urllib.request.Request(
            f"{base}/experiments", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.loads(reply.read())["total"] == 0
    finally:
        server.stop(grace=0)
