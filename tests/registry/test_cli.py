"""What `assay model` sends: a patch carries only what was given (labels replaced, cleared
or left alone; metadata merged, null removing a key), and usage mistakes are one line."""

from __future__ import annotations

import json

from google.protobuf import json_format

from assay.proto import api_pb2
from tests.cli.conftest import FakeApi, assert_ok, assert_one_line_error, master, run_cli

__all__ = ["master"]


def test_set_sends_only_what_was_given(master: FakeApi) -> None:
    master.responses["PatchModel"] = api_pb2.Model(name="m")

    assert_ok(
        run_cli(
            "model", "set", "m", "--metadata", "acc=0.9", "--metadata", "old=null", master=master
        )
    )
    assert_ok(run_cli("model", "set", "m", "--clear-labels", master=master))
    assert_ok(
        run_cli("m", "set", "m", "--description", "", "--label", "a", "--label", "b", master=master)
    )

    first, cleared, described = master.calls("PatchModel")
    assert json_format.MessageToDict(first.metadata) == {"acc": 0.9, "old": None}
    assert not first.HasField("labels")
    assert not first.HasField("description")
    assert cleared.HasField("labels")
    assert list(cleared.labels.labels) == []
    assert not cleared.HasField("metadata")
    assert described.HasField("description")
    assert described.description == ""
    assert list(described.labels.labels) == ["a", "b"]


def test_register_and_download_name_their_version(master: FakeApi) -> None:
    master.responses["RegisterModelVersion"] = api_pb2.ModelVersion(model="m", version=3)

    done = run_cli(
        "model", "register-version", "m", "UUID", "--notes", "n", "--label", "x", master=master
    )

    assert_ok(done)
    assert "as m version 3" in done.stdout
    [sent] = master.calls("RegisterModelVersion")
    assert (sent.name, sent.checkpoint_uuid, sent.notes, list(sent.labels)) == (
        "m",
        "UUID",
        "n",
        ["x"],
    )


def test_usage_mistakes_are_one_line(master: FakeApi) -> None:
    assert_one_line_error(run_cli("model", "set", "m", master=master), "nothing to change")
    assert_one_line_error(run_cli("model", "download", "m", master=master), "NAME [VERSION] DIR")
    assert_one_line_error(
        run_cli("model", "download", "m", "x", "d", master=master), "VERSION must be a number"
    )
    assert_one_line_error(
        run_cli("model", "set", "m", "--metadata", "novalue", master=master), "KEY=VALUE"
    )
    assert_one_line_error(run_cli("model", "delete", "m", master=master), "nothing deleted")
    assert master.calls("PatchModel") == []
    assert master.calls("DeleteModel") == []


def test_list_versions_is_determineds_name_for_versions(master: FakeApi) -> None:
    master.responses["ListModelVersions"] = api_pb2.ListModelVersionsResponse(
        versions=[api_pb2.ModelVersion(model="m", version=1, checkpoint_uuid="UUID")]
    )

    by_ours = run_cli("model", "versions", "m", "--json", master=master)
    by_determineds = run_cli("model", "list-versions", "m", "--json", master=master)

    assert_ok(by_determineds)
    assert by_determineds.stdout == by_ours.stdout
    assert "UUID" in by_determineds.stdout


def _versions() -> list[api_pb2.ModelVersion]:
    """Vicky's version of her own checkpoint, and mallory's, whose checkpoint its owner
    deleted."""
    kept = api_pb2.ModelVersion(
        model="m", version=1, checkpoint_uuid="UUID-1", user="vicky", code_owner="vicky"
    )
    kept.checkpoint.experiment_id = 7
    gone = api_pb2.ModelVersion(
        model="m", version=2, checkpoint_uuid="UUID-2", user="mallory", checkpoint_deleted=True
    )
    gone.checkpoint_deleted_at.FromSeconds(1_800_000_000)
    return [kept, gone]


def test_describe_shows_who_registered_each_version_and_whose_code(master: FakeApi) -> None:
    master.responses["GetModel"] = api_pb2.Model(name="m", owner="vicky", workspace="team")
    master.responses["ListModelVersions"] = api_pb2.ListModelVersionsResponse(versions=_versions())

    table = run_cli("model", "describe", "m", master=master)
    as_json = run_cli("model", "describe", "m", "--json", master=master)

    assert_ok(table)
    assert "workspace:    team" in table.stdout
    header, first, second = table.stdout.splitlines()[-3:]
    assert "REGISTERED BY" in header
    assert "CODE BY" in header
    assert first.split()[:3] == ["1", "UUID-1", "7"]
    assert first.split().count("vicky") == 2
    assert "UUID-2 (deleted by its owner)" in second
    assert "mallory" in second
    assert_ok(as_json)
    versions = json.loads(as_json.stdout)["versions"]
    assert [(v["registered_by"], v["code_owner"], v["checkpoint_deleted"]) for v in versions] == [
        ("vicky", "vicky", False),
        ("mallory", None, True),
    ]
    assert versions[1]["checkpoint_deleted_at"] == "2027-01-15T08:00:00Z"


def test_download_of_a_version_whose_checkpoint_was_deleted_says_so(master: FakeApi) -> None:
    master.responses["GetModelVersion"] = _versions()[1]

    done = run_cli("model", "download", "m", "2", "out", master=master)

    assert_one_line_error(
        done, "checkpoint UUID-2 of m version 2 was deleted by its owner: there is nothing"
    )
    assert master.calls("GetCheckpoint") == []


def test_create_names_the_workspace(master: FakeApi) -> None:
    master.responses["CreateModel"] = api_pb2.Model(name="m", workspace="team")

    assert_ok(run_cli("model", "create", "m", "--workspace", "team", master=master))

    [sent] = master.calls("CreateModel")
    assert (sent.name, sent.workspace) == ("m", "team")
