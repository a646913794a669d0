"""The deployment files, offline: Kubernetes manifests against the schemas of a current
Kubernetes, the compose file against the Compose Specification, kustomize's file list, and
the settings, limits and timings the files must agree on."""

import asyncio
import json
import re
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from service import __version__
from service.core.model_lookup import ready_models
from service.main import create_app
from service.runtime.repository import ModelRepository
from service.settings import Settings
from tests.deploy.kustomize import by_kind, kubectl_kustomize, render

ROOT = Path(__file__).parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
BASE, PVC, CLUSTER = KUBE / "base", KUBE / "overlays" / "pvc", KUBE / "overlays" / "cluster"
KUSTOMIZATIONS = [BASE, PVC, CLUSTER]  # every kustomization a user applies
FILL_POD = PVC / "fill-models.yaml"  # applied on its own, not through the kustomization
KUBERNETES_VERSION = "1.37"  # the newest kubernetes-validate bundles; current in 2026
NGINX = (ROOT / "deploy" / "nginx" / "nginx.conf").read_text()
IMAGE = f"opserve:{__version__}"
# what compose and the cluster overlay set: loads and unloads through any replica, every model
# of the repository loaded at start (explicit mode alone would load none)
EXPLICIT = {"OPSERVE_MODEL_CONTROL_MODE": "explicit", "OPSERVE_LOAD_MODELS": "*"}
# Settings the ConfigMap may set that other branches add (the model repository's).
COMING: set[str] = set()  # settings the manifests may set before the service reads them


def _name(folder: Path) -> str:
    return str(folder.relative_to(KUBE))


def _resources(folder: Path = BASE, app: str = "opserve") -> dict[str, dict[str, Any]]:
    """The objects of `app` the kustomization renders, by kind."""
    return by_kind(render(folder), app)


def _pod(resources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return resources["Deployment"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_every_kustomization_is_tested_and_lists_what_its_folder_holds() -> None:
    found = sorted(path.parent for path in KUBE.rglob("kustomization.yaml"))
    assert found == sorted(KUSTOMIZATIONS)
    for folder in KUSTOMIZATIONS:
        spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
        files = {r for r in spec["resources"] if (folder / r).is_file()}
        patches = {p["path"] for p in spec.get("patches", [])}
        on_disk = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
        assert files | patches | ({FILL_POD.name} if folder == PVC else set()) == on_disk
        for name in files | patches:
            documents = list(yaml.safe_load_all((folder / name).read_text()))
            assert len(documents) == 1 and documents[0]["apiVersion"] and documents[0]["kind"]


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=_name)
def test_rendered_objects_pass_the_kubernetes_schema(folder: Path) -> None:
    for manifest in render(folder):
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=_name)
def test_our_rendering_is_kustomizes(folder: Path) -> None:
    theirs = kubectl_kustomize(folder)
    if theirs is None:
        pytest.skip("no kubectl with kustomize v5 here to compare with")
    key = lambda m: (m["kind"], m["metadata"]["name"])  # noqa: E731  (kustomize sorts by kind)
    assert {key(m): m for m in render(folder)} == {key(m): m for m in theirs}


def test_the_fill_pod_passes_the_schema_and_mounts_the_claim() -> None:
    pod = yaml.safe_load(FILL_POD.read_text())
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    claim = _resources(PVC)["PersistentVolumeClaim"]["metadata"]["name"]
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim
    assert pod["spec"]["containers"][0]["image"] == IMAGE  # already on the nodes
    assert (
        pod["spec"]["securityContext"]["runAsUser"]
        == _pod(_resources())["securityContext"]["runAsUser"]
    )


def test_every_rendered_object_belongs_to_the_service_or_its_redis() -> None:
    for folder in KUSTOMIZATIONS:
        objects = render(folder)
        apps = sorted(m["metadata"]["labels"]["app.kubernetes.io/name"] for m in objects)
        expected = {"opserve"} | ({"opserve-redis"} if folder == CLUSTER else set())
        assert set(apps) == expected, _name(folder)
        assert all(
            m["metadata"]["labels"]["app.kubernetes.io/part-of"] == "opserve" for m in objects
        )


def test_cluster_overlay_runs_redis_persistent_and_hands_its_url_to_the_pods() -> None:
    ours, redis = _resources(CLUSTER), _resources(CLUSTER, "opserve-redis")
    assert set(redis) == {"Secret", "PersistentVolumeClaim", "Deployment", "Service"}
    pod = _pod(redis)
    (container,) = pod["containers"]
    args = " ".join(container["args"])
    assert "--appendonly yes" in args and "--appendfsync everysec" in args  # persistence on
    assert "--maxmemory-policy noeviction" in args  # writes refused, never keys evicted
    assert "--requirepass $(REDIS_PASSWORD)" in args
    (mount,) = container["volumeMounts"]
    assert "--dir /data" in args and mount["mountPath"] == "/data"
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = redis["PersistentVolumeClaim"]["metadata"]["name"]
    assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim
    assert redis["Deployment"]["spec"]["strategy"]["type"] == "Recreate"  # one pod on the claim
    labels = redis["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert redis["Service"]["spec"]["selector"].items() <= labels.items()
    assert redis["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"][
        "readOnlyRootFilesystem"]  # fmt: skip
    # the URL the opserve pods get names the Service, its port and the password Redis takes
    secret = redis["Secret"]
    env, *control = _pod(ours)["containers"][0]["env"]
    assert env["name"] == "OPSERVE_CLUSTER_REDIS_URL"
    # repository control through any pod, every model loaded at start (issue 32)
    assert {item["name"]: item["value"] for item in control} == EXPLICIT
    assert not EXPLICIT.keys() & ours["ConfigMap"]["data"].keys()  # the overlay's, not the base's
    reference = env["valueFrom"]["secretKeyRef"]
    assert reference["name"] == secret["metadata"]["name"]
    url = urlsplit(secret["stringData"][reference["key"]])
    assert (url.scheme, url.hostname) == ("redis", redis["Service"]["metadata"]["name"])
    assert url.port == redis["Service"]["spec"]["ports"][0]["port"]
    (password,) = container["env"]
    assert password["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert url.password == secret["stringData"][password["valueFrom"]["secretKeyRef"]["key"]]
    Settings(cluster_redis_url=url.geturl())  # type: ignore[arg-type]  # a URL the service takes
    assert "OPSERVE_CLUSTER_REDIS_URL" not in ours["ConfigMap"]["data"]  # a secret, not a setting


def test_the_validator_can_fail() -> None:
    deployment = _resources()["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecs"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=_name)
def test_deployment_probes_drains_and_stays_unprivileged(folder: Path) -> None:
    resources = _resources(folder)
    pod = _pod(resources)
    (container,) = pod["containers"]
    assert (container["image"], container["imagePullPolicy"]) == (IMAGE, "IfNotPresent")
    assert container["readinessProbe"]["grpc"]["port"] == Settings.model_fields["grpc_port"].default
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
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}  # the metrics directory
    assert (
        container["envFrom"][0]["configMapRef"]["name"]
        == resources["ConfigMap"]["metadata"]["name"]
    )


def test_models_come_from_the_image_by_default_and_from_the_claim_in_the_overlay() -> None:
    base, pvc = _resources(BASE), _resources(PVC)
    assert base["ConfigMap"]["data"]["OPSERVE_MODEL_REPOSITORY"] == "/models"
    assert "PersistentVolumeClaim" not in base
    assert all("persistentVolumeClaim" not in volume for volume in _pod(base)["volumes"])
    assert "COPY examples/model_repository /models" in (ROOT / "Dockerfile").read_text()
    mounts = {m["mountPath"]: m for m in _pod(pvc)["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod(pvc)["volumes"]}
    claim = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
    assert mounts["/models"]["readOnly"] and claim["readOnly"]
    assert claim["claimName"] == pvc["PersistentVolumeClaim"]["metadata"]["name"]
    # ReadWriteOnce: the mode every storage class offers (the file says when to change it)
    assert pvc["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=_name)
def test_selectors_and_targets_agree(folder: Path) -> None:
    resources = _resources(folder)
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
    limits = _pod(_resources())["containers"][0]["resources"]
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
    assert {services[name]["image"] for name in replicas} == {IMAGE}
    assert sorted(re.findall(r"server (\w+):8000", NGINX)) == replicas
    started = [s for s in services.values() if "profiles" not in s]  # by a plain `up`
    assert [p for s in started for p in s.get("ports", [])] == [
        "${OPSERVE_HTTP_PORT:-8080}:8080", "${OPSERVE_GRPC_PUBLISHED_PORT:-8081}:8081"]  # fmt: skip
    assert sorted(re.findall(r"server (\w+):8001", NGINX)) == replicas  # gRPC
    assert "grpc_pass grpc://opserve_grpc;" in NGINX and "listen 8081 http2;" in NGINX
    for name in replicas:
        assert services[name]["volumes"][0] == (
            "${OPSERVE_MODELS_DIR:-./examples/model_repository}:/models:ro"
        )
        limit = int(services[name]["environment"]["OPSERVE_MAX_REQUEST_BYTES"])
        assert limit == Settings().max_request_bytes
    for body in re.findall(r"client_max_body_size (\d+)m;", NGINX):  # HTTP's and gRPC's
        assert int(body) * 2**20 == Settings().max_request_bytes
    assert "non_idempotent" in NGINX and "keepalive " in NGINX and "X-Request-ID $req_id" in NGINX


def test_compose_replicas_share_a_persistent_redis() -> None:
    compose = _compose()
    services = compose["services"]
    redis = services["redis"]
    assert redis["image"] == "redis:7"  # podman.STAND_INS makes it where no registry answers
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    assert "--maxmemory-policy noeviction" in command and "--dir /data" in command
    (volume,) = redis["volumes"]
    assert volume == "redis-data:/data" and "redis-data" in compose["volumes"]
    assert "ports" not in redis  # the compose network only
    for name in ("app1", "app2", "app3"):
        url = urlsplit(services[name]["environment"]["OPSERVE_CLUSTER_REDIS_URL"])
        assert (url.scheme, url.hostname, url.port) == ("redis", "redis", 6379)
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        assert EXPLICIT.items() <= services[name]["environment"].items()
        Settings(cluster_redis_url=url.geturl())  # type: ignore[arg-type]


def test_the_shipped_settings_serve_every_example_model_sequences_too() -> None:
    """Compose's and the overlay's control settings on the repository the image carries: every
    model ready at start, one of them a sequence model to try the cluster's sequences with."""
    settings = Settings(model_control_mode=EXPLICIT["OPSERVE_MODEL_CONTROL_MODE"],  # type: ignore[arg-type]
                        load_models=EXPLICIT["OPSERVE_LOAD_MODELS"])  # fmt: skip
    repository = ModelRepository(ROOT / "examples" / "model_repository", settings)
    asyncio.run(repository.start())
    rows = {row["name"]: row["state"] for row in repository.index(False)}
    assert rows == {"tile_shape": "READY", "simple_sequence": "READY"}
    (sequence,) = (m for m in ready_models(repository) if m.name == "simple_sequence")
    assert sequence.plan is not None  # a sequence model (sequence_batching)


def test_dockerignore_keeps_the_build_context_small() -> None:
    kept = [
        line for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    assert kept == ["!pyproject.toml", "!README.md", "!api_schemas/", "!service/",
                    "!examples/model_repository/"]  # fmt: skip
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in dockerfile
    assert re.search(r"^USER 10001", dockerfile, re.M) and "HEALTHCHECK" in dockerfile
    assert f"docker build -t {IMAGE} ." in dockerfile


def test_prometheus_is_a_profile_scraping_every_replica() -> None:
    services = _compose()["services"]
    prometheus = services["prometheus"]
    assert prometheus["profiles"] == ["prometheus"]  # off unless asked for
    assert "depends_on" not in prometheus  # never holds the replicas or the balancer back
    mounted = "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
    assert prometheus["volumes"] == [mounted]
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    (targets,) = job["static_configs"]
    replicas = sorted(name for name, s in services.items() if s["image"].startswith("opserve"))
    assert (job["metrics_path"], targets["targets"]) == (
        "/metrics",
        [f"{r}:8000" for r in replicas],
    )


def test_the_dashboard_reads_only_what_the_server_exports() -> None:
    """Every metric a panel queries is on /metrics after one request (Triton's names without
    `_total`), the response cache's (nv_cache_*) included."""
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "opserve.json").read_text())
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\b(?:nv|opserve)_\w+", target["expr"])}  # fmt: skip
    body = {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1], "data": [1]},
                       {"name": "repeats", "datatype": "INT64", "shape": [1], "data": [2]}]}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    with TestClient(create_app(Settings(access_log=False))) as client:
        assert client.post("/v2/models/Tile/versions/13/infer", json=body).status_code == 200
        text = client.get("/metrics").text
    exported = set(re.findall(r"^(?:# TYPE )?(\w+)[{ ]", text, re.M))  # a family, or a sample
    assert {"nv_inference_request_success", "nv_inference_count"} <= queried
    assert {"nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model"} <= queried
    assert queried <= exported, queried - exported
    assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} == {"${datasource}"}
