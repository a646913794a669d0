"""docs/deployment.md's way from a built image to a reachable service on Kubernetes: its commands
name the image, kustomizations, objects and ports the manifests have, and its curl examples
print what the guide shows, run as written against the service started with the image's
settings. (No cluster runs in the tests: the manifests themselves are in test_manifests.py.)"""

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.live_server import Server, serve
from tests.curl_examples import assert_prints_as_shown, examples, need_curl
from tests.deploy.kustomize import by_kind, render
from tests.deploy.test_manifests import CLUSTER, FILL_POD, IMAGE, KUSTOMIZATIONS, ROOT

GUIDE = (ROOT / "docs" / "deployment.md").read_text()
SECTION = GUIDE.split("## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
COMMANDS = [line for block in re.findall(r"```bash\n(.*?)```", SECTION, re.S)
            for line in block.splitlines()]  # fmt: skip
EXAMPLES = examples(SECTION)


def _words(prefix: str) -> list[list[str]]:
    """Every command line starting with `prefix`, split into words (comments dropped)."""
    return [shlex.split(line, comments=True) for line in COMMANDS if line.startswith(prefix)]


def test_the_image_built_and_loaded_is_the_one_the_manifests_name() -> None:
    assert ["docker", "build", "-t", IMAGE, "."] in _words("docker build")
    assert ["kind", "load", "docker-image", IMAGE, "--name", "opserve"] in _words("kind load")
    for folder in KUSTOMIZATIONS:
        (container,) = by_kind(render(folder))["Deployment"]["spec"]["template"]["spec"][
            "containers"
        ]
        assert (container["image"], container["imagePullPolicy"]) == (IMAGE, "IfNotPresent")


def test_kubectl_commands_name_what_the_manifests_hold() -> None:
    applied = [Path(words[-1]) for words in _words("kubectl apply -k")]
    assert sorted(ROOT / path for path in applied) == sorted(KUSTOMIZATIONS)
    for words in _words("kubectl apply -f"):
        for path in words[3::2]:
            assert path.startswith("https://") or (ROOT / path).is_file(), path
    objects = by_kind(render(KUSTOMIZATIONS[0]))
    deployment, service = objects["Deployment"]["metadata"]["name"], objects["Service"]
    redis = by_kind(render(CLUSTER), "opserve-redis")["Deployment"]["metadata"]["name"]
    for words in _words("kubectl rollout status"):
        assert words[3] in (f"deployment/{deployment}", f"deployment/{redis}")
    ((*_, target, ports),) = _words("kubectl port-forward")
    assert target == f"svc/{service['metadata']['name']}"
    assert int(ports.split(":")[1]) == service["spec"]["ports"][0]["port"]
    assert ports.split(":")[0] == "8080" and all("localhost:8080" in c for c, _ in EXAMPLES)
    fill_pod = FILL_POD.read_text()
    assert "name: opserve-models-fill" in fill_pod and "mountPath: /volume" in fill_pod
    assert any("opserve-models-fill:/volume/models/" in line for line in COMMANDS)
    assert any("--kubelet-insecure-tls" in line for line in COMMANDS)  # metrics-server on kind


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    need_curl()
    # the image's settings: its model repository is examples/model_repository (Dockerfile)
    with serve(model_repository=str(ROOT / "examples" / "model_repository")) as running:
        yield running


def test_the_guide_has_examples() -> None:
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize(("command", "shown"), EXAMPLES)
def test_example_prints_as_documented(server: Server, command: str, shown: str) -> None:
    assert_prints_as_shown(command, shown, server.port, "localhost:8080")
