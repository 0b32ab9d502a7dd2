"""GET /api/v1/trials/{id}/logs?follow=true: server-sent events as lines are appended."""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
import time
from typing import Any

from assay.master.store import LogLine
from tests.http.conftest import Site, wait_for
from tests.master.conftest import ScriptedAgent
from tests.master.test_search import Harness


class EventReader:
    """Reads an SSE response on a thread: each event as (event name, data, id)."""

    def __init__(self, site: Site, path: str, headers: dict[str, str] | None = None) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", site.server.port, timeout=20)
        sent = {"Authorization": f"Bearer {site.token}", **(headers or {})}
        self.connection.request("GET", path, headers=sent)
        self.response = self.connection.getresponse()
        self.events: queue.Queue[tuple[str, Any, str] | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        name, data, event_id = "message", "", ""
        try:
            for raw in self.response:
                line = raw.decode().rstrip("\n")
                if line.startswith("data: "):
                    data = line[6:]
                elif line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("id: "):
                    event_id = line[4:]
                elif not line and data:
                    self.events.put((name, json.loads(data), event_id))
                    name, data, event_id = "message", "", ""
        except OSError:
            pass
        self.events.put(None)  # the server ended the stream

    def next(self, timeout: float = 10.0) -> tuple[str, Any, str] | None:
        return self.events.get(timeout=timeout)

    def close(self) -> None:
        """Hang up: the reader's blocked read returns, then the connection is closed."""
        sock = self.connection.sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self.reader.join(5)
        self.connection.close()


def test_follow_streams_lines_as_they_come_and_ends_with_the_trial(site: Site) -> None:
    agent = ScriptedAgent(site.master.port, "a1", slots=1)
    harness = Harness(agent, site.master.port)
    eid = site.create(activate=True)
    store = site.master.store
    wait_for(lambda: bool(store.list_trials(eid)))
    trial = store.list_trials(eid)[0]
    store.append_logs(trial.id, trial.run_id, [LogLine("before")])
    reader = EventReader(site, f"/api/v1/trials/{trial.id}/logs?follow=true")
    assert reader.response.status == 200
    assert reader.response.getheader("Content-Type") == "text/event-stream"
    event = reader.next()
    assert event is not None
    name, first, event_id = event
    assert (name, first["message"]) == ("message", "before")
    assert event_id == str(first["id"])
    for i in range(3):
        started = time.monotonic()
        store.append_logs(trial.id, trial.run_id, [LogLine(f"live {i}", rank=i)])
        event = reader.next()
        assert event is not None
        assert event[1]["message"] == f"live {i}"
        assert event[1]["rank"] == i
        assert time.monotonic() - started < 2.0
    harness.run_one()  # the trial trains and completes
    end = reader.next()
    assert end is not None
    assert end[0] == "end"
    assert reader.next() is None  # and the response is over
    reader.close()
    agent.close()


def test_follow_resumes_after_last_event_id_and_stops_when_the_client_goes(site: Site) -> None:
    eid = site.create(activate=True)  # no agent: the trial stays queued, never ends
    store = site.master.store
    wait_for(lambda: bool(store.list_trials(eid)))
    trial = store.list_trials(eid)[0]
    store.append_logs(trial.id, trial.run_id, [LogLine(f"old {i}") for i in range(3)])
    second_id = store.tail_logs(trial.id)[1].id
    path = f"/api/v1/trials/{trial.id}/logs?follow=true"
    reader = EventReader(site, path, {"Last-Event-ID": str(second_id)})
    event = reader.next()
    assert event is not None
    assert event[1]["message"] == "old 2"
    assert site.server.followers == 1
    reader.close()
    # The server notices the client left and lets go of the stream.
    wait_for(lambda: site.server.followers == 0, timeout=5)
    assert site.get("/api/v1/health").status == 200


def test_follow_of_an_ended_trial_sends_its_lines_and_ends(site: Site) -> None:
    eid = site.create(activate=True)
    store = site.master.store
    wait_for(lambda: bool(store.list_trials(eid)))
    trial = store.list_trials(eid)[0]
    store.append_logs(trial.id, trial.run_id, [LogLine("only line")])
    assert site.post(f"/api/v1/experiments/{eid}/kill").status == 200
    wait_for(lambda: store.get_trial(trial.id).state in ("CANCELED", "ERROR", "COMPLETED"))
    reader = EventReader(site, f"/api/v1/trials/{trial.id}/logs?follow=1")
    first, end = reader.next(), reader.next()
    assert first is not None
    assert first[1]["message"] == "only line"
    assert end is not None
    assert end[0] == "end"
    assert reader.next() is None
    reader.close()
