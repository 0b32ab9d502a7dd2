"""deploy/compose and deploy/kubernetes, checked against their schemas (bundled by the dev
extras' check-jsonschema and kubernetes-validate: no network), and the shell scripts by
shellcheck."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from assay.agent._config import AgentSettings
from assay.common.settings import settings_of
from assay.master._config import MasterConfig
from tests.deploy.conftest import DEPLOY, ROOT

COMPOSE = DEPLOY / "compose"
KUBERNETES = DEPLOY / "kubernetes"


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    return data


def test_compose_file_matches_the_compose_spec() -> None:
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)

    errors = sorted(validator.iter_errors(_compose()), key=lambda e: list(e.absolute_path))

    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_compose_runs_master_and_postgres_and_a_cpu_agent_on_request() -> None:
    services = _compose()["services"]

    assert set(services) == {"postgres", "master", "agent"}
    assert "profiles" not in services["master"]
    assert "profiles" not in services["postgres"]
    assert services["agent"]["profiles"] == ["cpu-agent"]
    assert services["master"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    db_url = services["master"]["environment"]["ASSAY_DB_URL"]
    assert db_url.startswith("postgresql+psycopg://assay:${ASSAY_DB_PASSWORD")
    assert services["agent"]["environment"]["ASSAY_MASTER"] == "master:8090"
    build = services["master"]["build"]
    context = (COMPOSE / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).is_file()
    assert "TORCH_INDEX_URL" in build["args"]


def test_every_variable_compose_reads_is_in_the_example_env() -> None:
    text = (COMPOSE / "compose.yaml").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)", text))
    example = {
        line.split("=", 1)[0]
        for line in (COMPOSE / "env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    # The image, ports and torch index have defaults that rarely change.
    defaulted = {"ASSAY_IMAGE", "TORCH_INDEX_URL", "ASSAY_GRPC_PORT", "ASSAY_HTTP_PORT"}
    assert used - defaulted <= example


def test_dockerfile_builds_torch_from_a_build_arg_and_runs_unprivileged() -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    instructions = [line.split(None, 1) for line in text.splitlines() if line and line[0].isupper()]
    stages = [args for op, args in instructions if op == "FROM"]

    assert stages[-1].startswith("python:3.11")
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert '--index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"' in text
    # The web UI stage it copies from exists, into the Python the image runs.
    copied = re.search(r"COPY --from=(\w+) \S+ (\S+)", text)
    assert copied is not None
    assert any(s.endswith(f"AS {copied.group(1)}") for s in stages)
    assert copied.group(2).startswith("/usr/local/lib/python3.11/site-packages/assay/master/")
    assert ("USER", "10001:10001") in [(op, args) for op, args in instructions]


def _manifests() -> list[tuple[Path, dict[str, Any]]]:
    out: list[tuple[Path, dict[str, Any]]] = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out.extend((path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return out


def test_kubernetes_manifests_match_the_kubernetes_schemas() -> None:
    version = kubernetes_validate.latest_version()
    problems = []
    for path, doc in _manifests():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{path.name} {doc['kind']}: {e.message} at {list(e.path)}")

    assert not problems, "\n".join(problems)


def test_kubernetes_has_every_part_and_kustomize_lists_every_file() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in _manifests()}
    assert {
        ("Namespace", "assay"),
        ("Secret", "assay-secrets"),
        ("StatefulSet", "assay-postgres"),
        ("Service", "assay-postgres"),
        ("Deployment", "assay-master"),
        ("Service", "assay-master"),
        ("PersistentVolumeClaim", "assay-master-state"),
        ("DaemonSet", "assay-agent"),
    } <= kinds
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    files = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_the_agents_run_on_gpu_nodes_with_the_secret() -> None:
    (agent,) = [doc for _, doc in _manifests() if doc["kind"] == "DaemonSet"]
    pod = agent["spec"]["template"]["spec"]
    (container,) = pod["containers"]

    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "nvidia.com/gpu" in container["resources"]["limits"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ASSAY_MASTER"]["value"] == "assay-master.assay.svc:8090"
    assert env["ASSAY_JOIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "assay-secrets"
    # The pods' ASSAY_* names are settings the agent knows.
    known = {s.env for s in settings_of(AgentSettings)}
    assert {name for name in env if name.startswith("ASSAY_")} <= known


def test_the_master_and_compose_set_only_settings_the_master_knows() -> None:
    known = {s.env for s in settings_of(MasterConfig)}
    (master,) = [doc for _, doc in _manifests() if doc["kind"] == "Deployment"]
    (container,) = master["spec"]["template"]["spec"]["containers"]
    names = {e["name"] for e in container["env"]}
    names |= set(_compose()["services"]["master"]["environment"])
    assert {name for name in names if name.startswith("ASSAY_")} <= known


@pytest.mark.parametrize("script", sorted(p.name for p in DEPLOY.glob("*.sh")))
def test_shell_scripts_pass_shellcheck(script: str) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    done = subprocess.run(
        [shellcheck, "-x", script],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout
