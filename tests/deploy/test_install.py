"""deploy/install-agent.sh and install-master.sh, run into a throwaway root: the files they
write, upgrading in place, uninstalling, dry runs, and the installed daemons forming a
cluster with PostgreSQL."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from assay._rank_processes import free_port
from tests.deploy.conftest import DEPLOY, ROOT, VENV, Installer, wait_for_agents
from tests.e2e.conftest import stop_processes

AGENT_CONFIG = "/etc/assay/agent.yaml"
AGENT_UNIT = "/etc/systemd/system/assay-agent.service"
MASTER_CONFIG = "/etc/assay/master.yaml"
MASTER_UNIT = "/etc/systemd/system/assay-master.service"


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its content (None for folders)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink() else None
        for p in sorted(root.rglob("*"))
    }


def _unit(text: str) -> dict[str, list[str]]:
    """`Key=value` lines of a unit file, by key."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _verify_unit(unit: Path, root: Path, tmp_path: Path) -> None:
    """`systemd-analyze verify`, with ExecStart pointing into the throwaway root (the
    unit names the paths the machine will have)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    copy = tmp_path / "verify" / unit.name
    copy.parent.mkdir(exist_ok=True)
    copy.write_text(unit.read_text().replace(VENV, str(root) + VENV))
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert unit.name not in done.stderr, done.stderr  # no warning about our unit either


def test_dry_run_changes_nothing(installer: Installer) -> None:
    args = ["--master", "10.0.0.5:8090", "--join-token", "s3cret", "--slot-type", "cuda"]
    done = installer.run("install-agent.sh", "--dry-run", *args)

    assert not installer.root.exists()
    assert "would run:" in done.stdout
    assert f"would write {installer.root}{AGENT_CONFIG}" in done.stdout
    assert "master: '10.0.0.5:8090'" in done.stdout
    assert "s3cret" not in done.stdout  # secrets are not printed
    assert "skipped: systemctl enable --now assay-agent.service" in done.stdout


def test_master_dry_run_hides_the_database_password(installer: Installer) -> None:
    url = "postgresql+psycopg://assay:pa55word@db.example/assay"
    done = installer.run("install-master.sh", "--dry-run", "--db-url", url)

    assert not installer.root.exists()
    assert "db_url: <hidden>" in done.stdout
    assert "pa55word" not in done.stdout


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("install-agent.sh", [], "--master HOST:PORT is required"),
        ("install-agent.sh", ["--master", "nohost"], "--master must be HOST:PORT"),
        ("install-agent.sh", ["--master", "h:1", "--slots", "0"], "--slots must be a positive"),
        ("install-agent.sh", ["--master", "h:1", "--slot-type", "tpu"], "cpu or cuda"),
        ("install-agent.sh", ["--purge"], "--purge goes with --uninstall"),
        ("install-agent.sh", ["--bogus"], "unknown option '--bogus'"),
        ("install-master.sh", [], "--db-url is required"),
        ("install-master.sh", ["--db-url", "postgresql://x@y/z"], "postgresql+psycopg://"),
        (
            "install-master.sh",
            ["--db-url", "postgresql+psycopg://x@y/z", "--grpc-port", "7e3"],
            "0-65535",
        ),
    ],
)
def test_bad_arguments_are_refused_before_anything_changes(
    installer: Installer, script: str, args: list[str], message: str
) -> None:
    done = installer.run(script, *args, check=False)

    assert done.returncode == 1
    assert message in done.stderr
    assert not installer.root.exists()


def test_the_default_package_is_the_checkout_the_installer_sits_in(installer: Installer) -> None:
    done = installer.run("install-agent.sh", "--dry-run", "--master", "10.0.0.5:8090")

    pip = next(line for line in done.stdout.splitlines() if "-m pip install" in line)
    assert pip.endswith(f" {ROOT}")
    assert not installer.root.exists()


def test_outside_a_checkout_the_package_must_be_named(installer: Installer, tmp_path: Path) -> None:
    copy = tmp_path / "copy" / "deploy"
    shutil.copytree(DEPLOY, copy)
    run = functools.partial(
        subprocess.run, capture_output=True, text=True, env=installer.env, timeout=60, check=False
    )
    root = ["--root", str(installer.root), "--dry-run"]

    refused = run(["bash", str(copy / "install-agent.sh"), *root, "--master", "h:8090"])
    named = run(
        ["bash", str(copy / "install-agent.sh"), *root, "--master", "h:8090", "--package", "/w.whl"]
    )
    uninstall = run(["bash", str(copy / "install-master.sh"), *root, "--uninstall"])

    assert refused.returncode == 1
    assert f"--package is required: {copy} is not inside an Assay checkout" in refused.stderr
    assert "PyPI's 'assay' is another project" in refused.stderr
    assert "pip install" not in refused.stdout
    assert named.returncode == 0, named.stderr
    assert "--disable-pip-version-check /w.whl\n" in named.stdout
    assert uninstall.returncode == 0, uninstall.stderr  # nothing to install, nothing to name
    assert not installer.root.exists()


def test_help_lists_the_options() -> None:
    for script in ("install-agent.sh", "install-master.sh"):
        done = subprocess.run(
            ["bash", str(DEPLOY / script), "--help"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        for option in ("--package", "--root", "--dry-run", "--uninstall", "--purge", "--no-deps"):
            assert option in done.stdout


@pytest.mark.slow
def test_agent_install_upgrade_and_uninstall(installer: Installer, tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = installer.install(
        "install-agent.sh",
        "--master",
        "10.0.0.5:8090",
        "--join-token",
        "s3cret",
        "--slot-type",
        "cpu",
        "--slots",
        "2",
        "--work-dir",
        str(work),
    )

    # The virtual environment, the config and the unit.
    assert installer.binary("assay-agent").is_file()
    config = installer.path(AGENT_CONFIG)
    assert yaml.safe_load(config.read_text()) == {
        "master": "10.0.0.5:8090",
        "join_token": "s3cret",
        "slot_type": "cpu",
        "slots": 2,
        "work_dir": str(work),
    }
    assert config.stat().st_mode & 0o777 == 0o640  # it holds the join token
    unit = installer.path(AGENT_UNIT)
    keys = _unit(unit.read_text())
    assert keys["ExecStart"] == [f"{VENV}/bin/assay-agent --config {AGENT_CONFIG}"]
    assert keys["Restart"] == ["on-failure"]
    assert keys["RestartPreventExitStatus"] == ["3"]
    assert keys["User"] == ["assay"]
    assert keys["KillMode"] == ["mixed"]
    assert keys["NoNewPrivileges"] == ["yes"]
    assert "PrivateDevices" not in keys  # the trials need /dev/nvidia*
    assert "@" not in unit.read_text()  # every placeholder filled in
    _verify_unit(unit, installer.root, tmp_path)
    assert "skipped: systemctl enable --now assay-agent.service" in first.stdout
    assert "journalctl -u assay-agent" in first.stdout

    # Again, with an edited config: Assay is upgraded in place, the edit is kept.
    config.write_text(config.read_text() + "grace: 12\n")
    edited = config.read_text()
    again = installer.install("install-agent.sh", "--master", "10.9.9.9:8090")
    assert "Upgrading Assay in" in again.stdout
    assert "ignored --master: the config is kept" in again.stdout
    assert config.read_text() == edited
    assert "checked /etc/assay/agent.yaml" in again.stdout

    # An edit this version does not accept stops the upgrade with the agent's message.
    config.write_text(edited + "slotz: 4\n")
    done = installer.run(
        "install-agent.sh",
        "--package",
        str(installer.wheel),
        "--no-deps",
        "--pip-args=--no-index",
        check=False,
    )
    assert done.returncode == 1
    assert "unknown key 'slotz'" in done.stderr
    config.write_text(edited)

    # --overwrite-config writes a new one from the arguments.
    installer.install("install-agent.sh", "--overwrite-config", "--master", "10.9.9.9:8090")
    assert yaml.safe_load(config.read_text())["master"] == "10.9.9.9:8090"

    # A dry run of the uninstall changes nothing; the uninstall keeps the config.
    before = _tree(installer.root)
    installer.run("install-agent.sh", "--uninstall", "--dry-run")
    assert _tree(installer.root) == before
    installer.run("install-agent.sh", "--uninstall")
    assert not installer.path(VENV).exists()
    assert not installer.path(AGENT_UNIT).exists()
    assert config.exists()

    # --purge removes the config too.
    installer.run("install-agent.sh", "--uninstall", "--purge")
    assert not config.exists()
    assert not installer.path("/etc/assay").exists()
    assert not installer.path("/opt/assay").exists()


@pytest.mark.slow
def test_installed_master_and_agent_form_a_cluster(
    installer: Installer, tmp_path: Path, empty_postgres: str
) -> None:
    port = free_port()
    installer.install(
        "install-master.sh",
        "--db-url",
        empty_postgres,
        "--grpc-port",
        str(port),
        "--http-port",
        "0",
        "--host",
        "127.0.0.1",
        "--state-dir",
        str(tmp_path / "state"),
        "--join-token",
        "t0ken-3f9c2a7e81d4",
    )
    installer.install(
        "install-agent.sh",
        "--master",
        f"127.0.0.1:{port}",
        "--join-token",
        "t0ken-3f9c2a7e81d4",
        "--slot-type",
        "cpu",
        "--slots",
        "1",
        "--agent-id",
        "gpu-node-1",
        "--work-dir",
        str(tmp_path / "work"),
    )
    master_config = yaml.safe_load(installer.path(MASTER_CONFIG).read_text())
    assert master_config["db_url"] == empty_postgres
    assert master_config["advertised_address"] == f"127.0.0.1:{port}"
    master_unit = installer.path(MASTER_UNIT)
    assert _unit(master_unit.read_text())["ExecStart"] == [
        f"{VENV}/bin/assay-master --config {MASTER_CONFIG}"
    ]
    _verify_unit(master_unit, installer.root, tmp_path)

    # The units' commands, run from the throwaway root.
    logs = [tmp_path / "master.log", tmp_path / "agent.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for program, config, log in [
            ("assay-master", MASTER_CONFIG, logs[0]),
            ("assay-agent", AGENT_CONFIG, logs[1]),
        ]:
            command = [str(installer.binary(program)), "--config", str(installer.path(config))]
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        command, stdout=out, stderr=subprocess.STDOUT, env=installer.env
                    )
                )
        agents = wait_for_agents(f"127.0.0.1:{port}", 1, logs)
    finally:
        stop_processes(procs)
    assert [a["id"] for a in agents] == ["gpu-node-1"]
    master_log = logs[0].read_text()
    assert "gpu-node-1 connected with 1 cpu slots" in master_log, master_log


@pytest.mark.parametrize("package", ["assay==1.2.3", "assay", "Assay[cuda] >= 1.0"])
def test_a_bare_assay_requirement_needs_an_index(installer: Installer, package: str) -> None:
    agent = ["install-agent.sh", "--dry-run", "--master", "h:8090", "--package", package]

    refused = installer.run(*agent, check=False)
    extra = installer.run(
        *agent, "--pip-args", "--extra-index-url https://pypi.example", check=False
    )
    indexed = installer.run(*agent, "--pip-args", "--index-url https://pypi.example/simple")
    found = installer.run(*agent, "--pip-args=--no-index --find-links=/srv/wheels")

    assert refused.returncode == 1
    assert f"--package {package} would install PyPI's 'assay', another project" in refused.stderr
    assert "pip install" not in refused.stdout
    assert extra.returncode == 1  # PyPI is still asked, and may win
    assert indexed.stdout.count("--index-url https://pypi.example/simple") == 1
    assert f"--find-links=/srv/wheels {package}\n" in found.stdout
    assert not installer.root.exists()
