"""The installers run for real, into a throwaway root, with the checkout built as a wheel.

Nothing is downloaded: the installed virtual environment gets Assay from the wheel
(`--no-deps --pip-args=--no-index`), and its dependencies (torch, grpcio, ...) from this
test environment, whose site-packages are put on PYTHONPATH less Assay itself and pip (a
folder of links), so that the installed copy of Assay is the one that runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.credentials import ADMIN_PASSWORD
from tests.store.conftest import _empty_postgres, postgres_url
from tests.wheel import build_wheel

__all__ = ["postgres_url"]

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
VENV = "/opt/assay/venv"  # the installers' default, under the throwaway root


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = build_wheel(out)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("assay-*.whl")
    return built


@pytest.fixture(scope="session")
def dependencies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This environment's packages without Assay and pip, for PYTHONPATH."""
    links = tmp_path_factory.mktemp("site-packages")
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        name = entry.name
        if name.startswith(("assay", "__editable__", "pip-")) or name == "pip":
            continue
        if name.endswith(".pth"):
            continue
        (links / name).symlink_to(entry)
    return links


@dataclass
class Installer:
    """Runs deploy/install-*.sh into `root` without a terminal."""

    root: Path
    env: dict[str, str]
    request: pytest.FixtureRequest

    @property
    def wheel(self) -> Path:
        """The checkout as a wheel (built once, by the first test that installs)."""
        built: Path = self.request.getfixturevalue("wheel")
        return built

    def run(self, script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["bash", str(DEPLOY / script), "--root", str(self.root), *args],
            capture_output=True,
            text=True,
            env=self.env,
            stdin=subprocess.DEVNULL,
            timeout=300,
            check=False,
        )
        if check:
            assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def install(self, script: str, *args: str) -> subprocess.CompletedProcess[str]:
        """A real install of the wheel, offline."""
        return self.run(
            script,
            "--package",
            str(self.wheel),
            "--no-deps",
            "--pip-args=--no-index",
            "--python",
            sys.executable,
            *args,
        )

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def binary(self, name: str) -> Path:
        return self.path(f"{VENV}/bin/{name}")


@pytest.fixture
def installer(request: pytest.FixtureRequest, tmp_path: Path, dependencies: Path) -> Installer:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_")}
    env["PYTHONPATH"] = str(dependencies)
    env["PYTHONUNBUFFERED"] = "1"
    # The installed master's first admin, for the CLI's login (tests/conftest.py).
    env["ASSAY_INITIAL_ADMIN_PASSWORD"] = ADMIN_PASSWORD
    # The installed Python is under pytest's root-only directory: no isolated uid could
    # run it, and a root agent refuses to start so (tests/agent/test_isolation.py).
    env["ASSAY_ISOLATION"] = "none"
    return Installer(root=tmp_path / "root", env=env, request=request)


def wait_for_agents(
    address: str, count: int, logs: list[Path], timeout: float = 60
) -> list[dict[str, Any]]:
    """The connected agents of `assay agent list --json`, once there are `count`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = subprocess.run(
            [sys.executable, "-m", "assay.cli.main", "-m", address, "agent", "list", "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode == 0:
            listed: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
            agents = [a for a in listed if a["connected"]]
            if len(agents) >= count:
                return agents
        time.sleep(0.3)
    tails = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"{count} agent(s) did not register:\n{tails}")


@pytest.fixture
def empty_postgres(postgres_url: str) -> str:
    _empty_postgres(postgres_url)
    return postgres_url
