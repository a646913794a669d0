"""The deployment files, offline: Kubernetes manifests against the schemas of a current
Kubernetes, the compose file against the Compose Specification, kustomize's file list, and
the settings, limits and timings the files must agree on."""

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from service.settings import Settings

ROOT = Path(__file__).parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.37"  # the newest kubernetes-validate bundles; current in 2026
NGINX = (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
# Settings the ConfigMap may set that other branches add (the model repository's).
COMING: set[str] = set()  # settings the manifests may set before the service reads them


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((KUBE / "kustomization.yaml").read_text())  # type: ignore[no-any-return]


def _resources() -> dict[str, dict[str, Any]]:
    """Every manifest the kustomization lists, by kind."""
    manifests = [
        yaml.safe_load((KUBE / name).read_text()) for name in _kustomization()["resources"]
    ]
    return {m["kind"]: m for m in manifests}


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_kustomization_lists_every_manifest_and_each_exists_and_parses() -> None:
    listed = _kustomization()["resources"]
    on_disk = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(listed) == sorted(on_disk)
    for name in listed:
        documents = list(yaml.safe_load_all((KUBE / name).read_text()))
        assert len(documents) == 1 and documents[0]["apiVersion"] and documents[0]["kind"], name


@pytest.mark.parametrize("name", sorted(p.name for p in KUBE.glob("*.yaml")))
def test_manifest_passes_the_kubernetes_schema(name: str) -> None:
    manifest = yaml.safe_load((KUBE / name).read_text())
    if manifest["kind"] == "Kustomization":
        pytest.skip("kustomize's own file is not a Kubernetes resource (checked above)")
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_the_validator_can_fail() -> None:
    deployment = _resources()["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecs"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_deployment_probes_drains_and_stays_unprivileged() -> None:
    resources = _resources()
    pod = resources["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    settings = resources["ConfigMap"]["data"]
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = int(settings["OPSERVE_GRACEFUL_SHUTDOWN_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] > pause + grace
    assert resources["Deployment"]["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models"]["readOnly"] and "/tmp" in mounts  # /tmp: the metrics directory
    assert (
        container["envFrom"][0]["configMapRef"]["name"]
        == resources["ConfigMap"]["metadata"]["name"]
    )


def test_selectors_and_targets_agree() -> None:
    resources = _resources()
    labels = resources["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget", "Deployment"):
        spec = resources[kind]["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert selector.items() <= labels.items(), kind
    assert resources["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == "opserve"
    (metric,) = resources["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"


def test_configmap_settings_are_settings_and_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _resources()["ConfigMap"]["data"]
    known = {f"OPSERVE_{name.upper()}" for name in Settings.model_fields} | COMING
    assert set(data) <= known
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    limits = _resources()["Deployment"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    memory = int(limits["limits"]["memory"].removesuffix("Mi")) * 2**20
    # at rest, plus body and output of each large request the kernel threads may hold at once
    at_most = 256 * 2**20 + settings.kernel_threads * 4 * settings.max_output_bytes
    assert memory >= at_most


def test_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads((ROOT / "tests" / "deploy" / "compose-spec.json").read_text())
    jsonschema.validate(_compose(), schema)
    broken = _compose()
    broken["services"]["lb"]["ports"] = {"8080": 8080}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_compose_nginx_and_settings_agree() -> None:
    services = _compose()["services"]
    replicas = sorted(name for name, s in services.items() if s["image"].startswith("opserve"))
    assert replicas == ["app1", "app2", "app3"]
    assert sorted(re.findall(r"server (\w+):8000", NGINX)) == replicas
    assert [p for s in services.values() for p in s.get("ports", [])] == [
        "${OPSERVE_HTTP_PORT:-8080}:8080"
    ]
    for name in replicas:
        assert services[name]["volumes"][0].endswith(":/models:ro")
        limit = int(services[name]["environment"]["OPSERVE_MAX_REQUEST_BYTES"])
        assert limit == Settings().max_request_bytes
    (body,) = re.findall(r"client_max_body_size (\d+)m;", NGINX)
    assert int(body) * 2**20 == Settings().max_request_bytes
    assert "non_idempotent" in NGINX and "keepalive " in NGINX and "X-Request-ID $req_id" in NGINX


def test_dockerignore_keeps_the_build_context_small() -> None:
    kept = [
        line for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    assert kept == ["!pyproject.toml", "!README.md", "!api_schemas/", "!service/"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in dockerfile
    assert re.search(r"^USER 10001", dockerfile, re.M) and "HEALTHCHECK" in dockerfile
