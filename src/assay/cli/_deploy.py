"""`assay deploy local up|demo|down`: a master and agents on this machine, as background
processes.

State (the SQLite store, checkpoints, logs, pids, the admin's password) lives under
--state-dir, so `down` finds what `up` started, and `up` again resumes the same
experiments with the same login.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal, TypeVar

import click

from assay.client import (
    CLUSTER_FILE,
    DEFAULT_STATE,
    Client,
    LocalCluster,
    MasterError,
    running_cluster,
)

from ._common import user_errors
from ._local_progress import (
    AgentDidNotJoin,
    LogTail,
    port_taken,
    progress,
    running,
    wait_for_agents,
    wait_for_master,
)

F = TypeVar("F", bound=Callable[..., Any])


@click.group()
def deploy() -> None:
    """Run Assay's daemons."""


@deploy.group()
def local() -> None:
    """A master and agents on this machine."""


PASSWORD_FILE = "admin-password"
DEMO_CONFIG = Path("examples/digits/adaptive_asha.yaml")
DEMO_MODEL_DIR = Path("examples/digits")
CREATED = re.compile(r"Created experiment (\d+)\b")


def _state_dir_option(func: F) -> F:
    return click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_STATE,
        show_default=True,
    )(func)


def _cluster_options(func: F) -> F:
    for option in reversed(
        [
            click.option("--agents", type=click.IntRange(min=0), default=1, show_default=True),
            click.option(
                "--slots-per-agent",
                type=click.IntRange(min=1),
                default=None,
                help="Slots per agent (default: every GPU, or one per CPU core).",
            ),
            click.option(
                "--slot-type",
                type=click.Choice(["auto", "cpu", "cuda"]),
                default="auto",
                show_default=True,
                help="What the agents offer. auto: the GPUs NVML finds, else the CPUs (as "
                "assay-agent chooses); cuda: GPUs or fail; cpu: CPUs even beside GPUs.",
            ),
            click.option("--port", type=click.IntRange(1, 65535), default=8090, show_default=True),
            click.option(
                "--http-port",
                type=click.IntRange(0, 65535),
                default=8080,
                show_default=True,
                help="the web UI and HTTP API (0: any free port)",
            ),
            _state_dir_option,
            click.option("--db-url", default=None, help="a PostgreSQL URL instead of SQLite"),
        ]
    ):
        func = option(func)
    return func


@local.command("up")
@_cluster_options
@user_errors
def up(
    agents: int,
    slots_per_agent: int | None,
    slot_type: str,
    port: int,
    http_port: int,
    state_dir: Path,
    db_url: str | None,
) -> None:
    """Start a master and AGENTS agents in the background, and log in as admin.

    It says what it does as it goes (on stderr: the master starting, its store migrated
    on a first start, each agent joining) and which slots each agent offers: its GPUs
    on a machine that has them (--slot-type auto), else one CPU slot per core. The
    master listens on 127.0.0.1:PORT. While it runs, every `assay` command talks to
    it unless --master or ASSAY_MASTER names another (for the default --state-dir; with
    another, name the master). The admin's password is made on the first start of a new
    store (SQLite or --db-url), or taken from ASSAY_INITIAL_ADMIN_PASSWORD, and kept
    (mode 0600) in STATE_DIR/admin-password, never printed.
    """
    _start(agents, slots_per_agent, slot_type, port, http_port, state_dir, db_url)


@local.command("demo")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path), default=DEMO_CONFIG)
@click.argument(
    "model_dir", type=click.Path(file_okay=False, path_type=Path), default=DEMO_MODEL_DIR
)
@_cluster_options
@user_errors
def demo(
    config: Path,
    model_dir: Path,
    agents: int,
    slots_per_agent: int | None,
    slot_type: str,
    port: int,
    http_port: int,
    state_dir: Path,
    db_url: str | None,
) -> None:
    """Run an experiment on the local cluster, started first if it is not running.

    The same as `assay deploy local up` then `assay experiment create CONFIG MODEL_DIR
    --follow`, ending with where to look in the web UI. CONFIG and MODEL_DIR default to
    the hyperparameter search of examples/digits in an Assay checkout.
    """
    from assay.errors import AssayError

    if not config.is_file() or not model_dir.is_dir():
        raise AssayError(
            f"{config} or {model_dir} is missing: run this from the root of an Assay "
            "checkout, or name a config and a model directory"
        )
    cluster = running_cluster(state_dir)
    if cluster is None:
        cluster = _start(agents, slots_per_agent, slot_type, port, http_port, state_dir, db_url)
    else:
        click.echo(f"using the local cluster already running from {state_dir}")
    click.echo(f"$ assay experiment create {config} {model_dir} --follow")
    returncode, experiment_id = _create_and_follow(cluster.master, config, model_dir)
    if experiment_id is None:
        raise AssayError("the experiment was not created (see above)")
    if cluster.ui_url is not None:
        click.echo(
            f"\nSee it in the web UI: {cluster.ui_url}experiments/{experiment_id} "
            f"(log in as admin with the password in {state_dir / PASSWORD_FILE}):\n"
            "  the learning curves of every trial, the hyperparameter plots (which lr and\n"
            "  n_filters reached the best accuracy), each trial's logs and checkpoints;\n"
            f"  and the cluster's agents and queue at {cluster.ui_url}cluster"
        )
    click.echo(
        f"Next: assay experiment describe {experiment_id}; "
        f"assay checkpoint list {experiment_id}; "
        f"stop the cluster with assay deploy local down"
    )
    if returncode != 0:
        sys.exit(returncode)


def _create_and_follow(master: str, config: Path, model_dir: Path) -> tuple[int, int | None]:
    """Run `assay experiment create CONFIG MODEL_DIR --follow`, its output shown as it
    comes (the progress, then the summary naming the best checkpoint); its exit status
    and the id of the experiment it created, if it got that far."""
    cmd = [sys.executable, "-m", "assay.cli.main", "--master", master, "experiment", "create"]
    cmd += [str(config), str(model_dir), "--follow"]
    experiment_id: int | None = None
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            click.echo(line, nl=False)
            created = CREATED.match(line)
            if experiment_id is None and created:
                experiment_id = int(created.group(1))
    return proc.returncode, experiment_id


def _start(
    agents: int,
    slots_per_agent: int | None,
    slot_type: str,
    port: int,
    http_port: int,
    state_dir: Path,
    db_url: str | None,
) -> LocalCluster:
    from assay.errors import AssayError

    pids_file = state_dir / "pids.json"
    if pids_file.exists() and any(_alive(p) for p in json.loads(pids_file.read_text()).values()):
        raise AssayError(f"a local cluster from {state_dir} is already running; run down first")
    if port_taken(port):
        raise AssayError(f"port {port} is in use; pick another with --port")
    if http_port and port_taken(http_port):
        raise AssayError(
            f"port {http_port} is in use; pick another with --http-port (0: any free port)"
        )
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # Left by a cluster that did not stop through `down`: it names that cluster's port,
    # which this one's master, once its pid is recorded, must not seem to answer on.
    (state_dir / CLUSTER_FILE).unlink(missing_ok=True)
    master_log = logs / "master.log"
    log_start = master_log.stat().st_size if master_log.exists() else 0
    pids: dict[str, int] = {}
    master_cmd = [
        sys.executable,
        "-m",
        "assay.master.main",
        "--grpc-port",
        str(port),
        "--host",
        "127.0.0.1",
        "--state-dir",
        str(state_dir / "master"),
        "--http-port",
        str(http_port),
    ]
    if db_url:
        master_cmd += ["--db-url", db_url]
    password, origin = _admin_password(state_dir / PASSWORD_FILE)
    address = f"127.0.0.1:{port}"
    store = "the PostgreSQL database of --db-url" if db_url else state_dir / "master" / "assay.db"
    progress(f"starting the master on {address} (store: {store}; log: {master_log})")
    pids["master"] = _spawn(master_cmd, master_log, {"ASSAY_INITIAL_ADMIN_PASSWORD": password})
    pids_file.write_text(json.dumps(pids))  # so that `down` can stop it whatever happens next
    if not wait_for_master(port, pids["master"], LogTail(master_log, log_start), timeout=60):
        _stop(pids["master"])
        pids_file.unlink(missing_ok=True)
        raise AssayError(f"the master did not start; see {master_log}")
    join_token = os.environ.get("ASSAY_JOIN_TOKEN") or _read_join_token(state_dir / "master")
    started: dict[str, tuple[int, LogTail]] = {}
    for i in range(agents):
        cmd = [
            sys.executable,
            "-m",
            "assay.agent.main",
            "--master",
            address,
            "--agent-id",
            f"local-{i}",
            "--work-dir",
            str(state_dir / f"agent-{i}"),
            # One user's machine: trials run as this user (isolation needs root agents).
            "--isolation",
            "none",
        ]
        if slot_type != "auto":
            cmd += ["--slot-type", slot_type]
        if slots_per_agent is not None:
            cmd += ["--slots", str(slots_per_agent)]
        log = logs / f"agent-{i}.log"
        offset = log.stat().st_size if log.exists() else 0
        pids[f"agent-{i}"] = _spawn(cmd, log, {"ASSAY_JOIN_TOKEN": join_token})
        started[f"local-{i}"] = (pids[f"agent-{i}"], LogTail(log, offset))
    pids_file.write_text(json.dumps(pids))
    try:
        offered = wait_for_agents(started, timeout=120)
    except AgentDidNotJoin as e:
        for name in sorted(pids, key=lambda name: name == "master"):
            _stop(pids[name])
        pids_file.unlink(missing_ok=True)
        raise AssayError(f"{e}; stopped the master and agents this started") from None
    cluster = LocalCluster(address, _ui_url(master_log, log_start, pids["master"]))
    # Whole or absent to the CLI reading it at the same time (see `local_master`).
    written = state_dir / f"{CLUSTER_FILE}.{os.getpid()}"
    written.write_text(json.dumps(asdict(cluster)))
    written.replace(state_dir / CLUSTER_FILE)
    click.echo(f"master at {address} (logs in {logs}); {agents} agent(s) started")
    for slots in offered:
        click.echo(slots.line(slot_type))
    click.echo(
        "single-tenant: trials run as you and can read this cluster's files; for a cluster "
        "other people use, run agents as root (deploy/install-agent.sh): a uid per trial"
    )
    click.echo(_ui_line(cluster.ui_url, master_log))
    _log_in(address, password, origin, state_dir / PASSWORD_FILE)
    return cluster


Origin = Literal["given", "kept", "made"]


def _admin_password(path: Path) -> tuple[str, Origin]:
    """The admin password to start the master with and log in with, and where it came
    from: ASSAY_INITIAL_ADMIN_PASSWORD ("given"), else the one kept at `path` ("kept"),
    else a new one, written there first ("made"). The master uses it only when its store
    has no admin yet (a new SQLite file or PostgreSQL database)."""
    kept = _read_private(path)  # an unsafe file is refused even when the variable is set
    given = os.environ.get("ASSAY_INITIAL_ADMIN_PASSWORD")
    if given:
        return given, "given"
    if kept:
        return kept, "kept"
    made = secrets.token_urlsafe(16)
    _write_private(path, made + "\n")
    return made, "made"


def _read_private(path: Path) -> str | None:
    """The text of `path` (None: there is none), only from a regular file of this user's
    that nobody else can read or write: a password file others could plant or swap for a
    link is not one to send to a master."""
    from assay.errors import AssayError

    fix = "remove it, and `up` makes a new one (or run as the user who made it)"
    try:
        # O_NOFOLLOW: a link is refused, not followed; O_NONBLOCK: a FIFO cannot hang us.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise AssayError(f"{path} is a symbolic link, not the password file; {fix}") from None
        raise AssayError(f"cannot read {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise AssayError(f"{path} is not a regular file; {fix}")
        if st.st_uid != os.getuid():
            raise AssayError(f"{path} belongs to another user (uid {st.st_uid}); {fix}")
        mode = stat.S_IMODE(st.st_mode)
        if mode != 0o600:
            raise AssayError(
                f"{path} has mode {mode:04o}, not 0600: others may have read or written it; {fix}"
            )
        return os.read(fd, 4096).decode(errors="replace").strip() or None
    finally:
        os.close(fd)


def _write_private(path: Path, text: str) -> None:
    """Write `path` whole, mode 0600, through a new file renamed over it: never through a
    link planted there, never a file others could read even for a moment."""
    from assay.errors import AssayError

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(tmp, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(tmp, path)  # replaces a link itself, never what it points to
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise AssayError(f"cannot write {path}: {e.strerror or e}") from None


def _ui_url(master_log: Path, offset: int, pid: int, timeout: float = 20.0) -> str | None:
    """The web UI's URL, as the master logs it once it serves HTTP (None: it did not)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        with master_log.open("rb") as log:
            log.seek(offset)
            found = re.search(rb"HTTP API and web UI on (\S+)", log.read())
        if found:
            return found.group(1).decode()
        time.sleep(0.2)
    return None


def _ui_line(url: str | None, master_log: Path) -> str:
    """Where the web UI is, and whether this master has one to serve."""
    if url is None:
        return f"web UI: not served (see {master_log})"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            page = answer.read(65536).decode(errors="replace")
    except (OSError, ValueError) as e:
        return f"web UI: {url} does not answer ({e})"
    if "<script" in page:
        return f"web UI: {url}"
    return f"web UI: {url} serves no UI: this install has no built web UI (master/webui_dist)"


def _read_join_token(master_state: Path) -> str:
    from assay.errors import AssayError

    path = master_state / "join-token"
    for _ in range(50):
        if path.exists():
            return path.read_text().strip()
        time.sleep(0.1)
    raise AssayError(f"the master wrote no join token to {path}")


def _log_in(address: str, password: str, origin: Origin, password_file: Path) -> None:
    """Log this user in as admin, so the next commands work without `assay user login`;
    keep a password that worked in `password_file`, and drop one made for nothing."""
    how = "log in with `assay user login admin`"
    c = Client(address)
    try:
        c.login("admin", password)
    except MasterError as e:
        if e.code != "UNAUTHENTICATED":
            click.echo(f"not logged in: {e}; {how}")
            return
        if origin == "given":
            why = "ASSAY_INITIAL_ADMIN_PASSWORD is not admin's password in this store"
        elif origin == "kept":
            why = f"admin's password was changed since it was kept in {password_file}"
        else:
            # This store had an admin already: the password just made was not used.
            password_file.unlink(missing_ok=True)
            why = (
                f"this store's admin was made before, and its password is not kept in "
                f"{password_file} (the master's log showed it when it was made)"
            )
        click.echo(f"not logged in: {why}; {how}")
        return
    finally:
        c.close()
    if origin == "given" and _read_private(password_file) != password:
        _write_private(password_file, password + "\n")
    click.echo(f"logged in as admin (password kept in {password_file})")


@local.command("down")
@_state_dir_option
@user_errors
def down(state_dir: Path) -> None:
    """Stop what `up` started (agents first, then the master)."""
    pids_file = state_dir / "pids.json"
    if not pids_file.exists():
        click.echo(f"no local cluster recorded in {state_dir}")
        return
    pids: dict[str, int] = json.loads(pids_file.read_text())
    order = sorted(pids, key=lambda name: name == "master")
    for name in order:
        _stop(pids[name])
    pids_file.unlink()
    (state_dir / CLUSTER_FILE).unlink(missing_ok=True)
    click.echo(f"stopped {', '.join(order)}")


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Start `cmd` in the background; secrets travel in `env`, never in the command line."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )
    return proc.pid


def _alive(pid: int) -> bool:
    return running(pid)


def _stop(pid: int, grace: float = 20.0) -> None:
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
