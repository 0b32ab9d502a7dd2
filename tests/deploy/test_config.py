"""The daemons' settings: one definition per key gives the file's validation, the ASSAY_*
variables, the flags and `--help-config`; flags > environment > file > defaults."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from assay.agent._config import AgentSettings, load_agent_settings
from assay.common.settings import SettingsError, reference, settings_of
from assay.master._config import MasterConfig, load_master_config
from tests.test_docs import generated_page


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def test_flags_beat_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    file = _file(tmp_path, "master: file:1\nslots: 1\ngrace: 5\nkeep_work_dirs: true\n")
    env = {"ASSAY_SLOTS": "2", "ASSAY_GRACE": "6", "ASSAY_MASTER": "env:2"}

    settings = load_agent_settings(file, {"slots": "3", "master": None}, env)

    assert (settings.master, settings.slots, settings.grace) == ("env:2", 3, 6.0)
    assert settings.keep_work_dirs is True  # from the file
    assert settings.heartbeat_timeout == 30.0  # the default
    assert settings.log_level == "INFO"


def test_the_agent_config_carries_every_setting(tmp_path: Path) -> None:
    file = _file(
        tmp_path,
        "master: m:8090\njoin_token: '0123'\nslot_type: cpu\nslots: 2\n"
        f"work_dir: {tmp_path}\naddress: 10.1.1.1\nagent_id: '42'\n",
    )

    config = load_agent_settings(file, {}, {})

    assert config.join_token == "0123"
    assert (config.agent_id, config.slot_type, config.slots) == ("42", "cpu", 2)
    assert (config.work_dir, config.address) == (tmp_path, "10.1.1.1")


def test_an_unknown_key_names_the_file_and_the_known_keys(tmp_path: Path) -> None:
    file = _file(tmp_path, "master: m:1\nslotz: 4\n")

    with pytest.raises(SettingsError) as caught:
        load_agent_settings(file, {}, {})

    message = str(caught.value)
    assert message.startswith(f"unknown key 'slotz' in {file} (did you mean 'slots'?); known keys:")
    assert "master, join_token, agent_id, slot_type, slots" in message


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("slots: four", {}, "slots in {file}: expected an integer, at least 1, got 'four'"),
        ("slots: true", {}, "slots in {file}: expected an integer, at least 1, got True"),
        ("slot_type: gpu", {}, "slot_type in {file}: expected one of cpu, cuda, got 'gpu'"),
        ("grace: [1]", {}, "grace in {file}: expected a number of seconds, 0 or more, got [1]"),
        ("join_token: {a: 1}", {}, "join_token in {file}: expected a string, got <hidden>"),
        # YAML 1.1 reads 0123 as the octal 83: refused rather than changed.
        ("agent_id: 0123", {}, "got 83 (YAML read a number: put the value in quotes)"),
        ("", {"ASSAY_SLOTS": "0"}, "ASSAY_SLOTS in the environment: expected an integer"),
        ("", {"ASSAY_KEEP_WORK_DIRS": "maybe"}, "expected true or false, got 'maybe'"),
    ],
)
def test_a_wrong_value_names_the_key_and_what_it_accepts(
    tmp_path: Path, text: str, env: dict[str, str], expected: str
) -> None:
    file = _file(tmp_path, "master: m:1\n" + text + "\n")

    with pytest.raises(SettingsError) as caught:
        load_agent_settings(file, {}, env)

    assert expected.format(file=file) in str(caught.value)


def test_a_missing_master_says_where_to_set_it(tmp_path: Path) -> None:
    expected = r"master is not set: set it in .*, ASSAY_MASTER or --master"
    with pytest.raises(SettingsError, match=expected):
        load_agent_settings(_file(tmp_path, "slots: 1\n"), {}, {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- a\n- b\n", "must be a mapping of keys to values"),
        ("a: [\n", "is not valid YAML"),
    ],
)
def test_a_file_that_is_no_mapping_is_refused(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(SettingsError, match=expected):
        load_agent_settings(_file(tmp_path, text), {}, {})


def test_the_master_reads_the_same_way(tmp_path: Path) -> None:
    file = tmp_path / "master.yaml"
    file.write_text("grpc_port: 9000\nhttp_port: 9001\npreemption: yes\njoin_token: t\n")

    config = load_master_config(file, {"http_port": "9002"}, {"ASSAY_GRPC_PORT": "9003"})

    assert (config.grpc_port, config.http_port, config.preemption) == (9003, 9002, True)
    assert config.join_token == "t"
    file.write_text("http_port: 70000\n")
    with pytest.raises(SettingsError, match="http_port in .*: expected an integer from 0 to 65535"):
        load_master_config(file, {}, {})


@pytest.mark.parametrize(
    ("cls", "module", "example"),
    [
        (AgentSettings, "assay.agent.main", "#grace: 30.0\n"),
        (MasterConfig, "assay.master.main", "#grpc_port: 8090\n"),
    ],
)
def test_help_config_documents_every_key_with_its_default(
    cls: type, module: str, example: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help-config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    text = done.stdout
    unwrapped = " ".join(line.lstrip("# ") for line in text.splitlines())
    for s in settings_of(cls):
        assert f"\n#{s.name}:" in text
        assert f"Environment: {s.env}. Flag: {s.flag}." in unwrapped
        assert s.required or f"Default: {s.describe_default()}." in unwrapped
    assert example in text


@pytest.mark.parametrize("cls", [AgentSettings, MasterConfig])
def test_every_field_is_a_documented_setting(cls: type) -> None:
    """A field made without `setting()` could not be set from the file, the environment
    or a flag, and --help-config would not show it."""
    assert [f.name for f in dataclasses.fields(cls)] == [s.name for s in settings_of(cls)]
    for s in settings_of(cls):
        assert s.help.endswith("."), s.name  # a sentence, as --help-config prints it


def test_the_docs_show_the_generated_reference() -> None:
    """The docs site's settings pages quote `--help-config`, generated at every build."""
    for cls, program, path, page in [
        (AgentSettings, "assay-agent", "/etc/assay/agent.yaml", "reference/agent-settings.md"),
        (MasterConfig, "assay-master", "/etc/assay/master.yaml", "reference/master-settings.md"),
    ]:
        readme = generated_page(page)
        assert reference(cls, program=program, path=path) in readme, (
            f"docs/{page}'s {path} reference is stale: it must show `{program} --help-config`"
        )


@pytest.mark.parametrize(
    ("module", "text", "expected"),
    [
        ("assay.agent.main", "master: m:1\nslotz: 1\n", "assay-agent: error: unknown key 'slotz'"),
        ("assay.master.main", "grpc_prot: 1\n", "error: unknown key 'grpc_prot'"),
        ("assay.master.main", "preemption: sometimes\n", "preemption in"),
    ],
)
def test_a_bad_config_stops_the_daemon_with_one_line(
    tmp_path: Path, module: str, text: str, expected: str
) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text(text)

    done = subprocess.run(
        [sys.executable, "-m", module, "--config", str(file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 1
    assert expected in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_check_config_prints_the_merged_settings_without_secrets(tmp_path: Path) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text("master: m:8090\njoin_token: s3cret\nslots: 2\n")

    agent = [sys.executable, "-m", "assay.agent.main", "--config", str(file)]
    done = subprocess.run(
        [*agent, "--check-config", "--slots", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert "slots: 3\n" in done.stdout
    assert "join_token: <hidden>" in done.stdout
    assert "s3cret" not in done.stdout
