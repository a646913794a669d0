"""Render a kustomization offline, for the manifest tests: the few kustomize features our
kustomizations use (resources, bases, labels, strategic merge patches, images), in Python, so
the tests need no kustomize binary. Where `kubectl kustomize` exists, the tests check that it
renders the same objects."""

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]
LABEL = "app.kubernetes.io/name"


def render(folder: Path) -> list[Manifest]:
    """The objects `kubectl kustomize folder` prints (in the order of the resources, where
    kustomize sorts them by kind)."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects: list[Manifest] = []
    for resource in spec.get("resources", []):
        path = folder / resource
        objects += render(path) if path.is_dir() else list(yaml.safe_load_all(path.read_text()))
    for entry in spec.get("labels", []):
        for manifest in objects:
            manifest["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for patch in spec.get("patches", []):
        change = yaml.safe_load((folder / patch["path"]).read_text())
        (target,) = [m for m in objects if _key(m) == _key(change)]
        _merge(target, change)
    for image in spec.get("images", []):
        for manifest in objects:
            for container in _containers(manifest):
                if container["image"].split(":")[0] == image["name"]:
                    name = image.get("newName", image["name"])
                    container["image"] = f"{name}:{image['newTag']}"
    return objects


def kubectl_kustomize(folder: Path) -> list[Manifest] | None:
    """What kubectl's own kustomize renders, or None where there is no kubectl."""
    if shutil.which("kubectl") is None:
        return None
    version = subprocess.run(["kubectl", "version", "--client", "-o", "json"], capture_output=True,
                             text=True, timeout=60).stdout  # fmt: skip
    if not version or int(json.loads(version).get("kustomizeVersion", "v0").lstrip("v")[0]) < 5:
        return None  # an old kubectl's kustomize (before v5) lacks `labels:`
    done = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return list(yaml.safe_load_all(done.stdout))


def by_kind(objects: list[Manifest], app: str = "opserve") -> dict[str, Manifest]:
    """The objects of one application (label app.kubernetes.io/name: the service's, or the
    cluster overlay's Redis, "opserve-redis"), one per kind (each has one of each)."""
    mine = [m for m in objects if m["metadata"].get("labels", {}).get(LABEL) == app]
    kinds = {m["kind"]: m for m in mine}
    assert len(kinds) == len(mine), "two objects of one kind"
    return kinds


def _key(manifest: Manifest) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


def _containers(manifest: Manifest) -> list[Manifest]:
    pod = manifest.get("spec", {}).get("template", {}).get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _merge(target: Any, change: Any) -> Any:
    """Strategic merge as kustomize does it for our patches: maps merge, lists of named items
    (containers, volumes, volumeMounts) merge by name, other values are replaced. (Kubernetes
    merges volumeMounts by mountPath; our patches add mounts new in both.)"""
    if isinstance(target, dict) and isinstance(change, dict):
        for key, value in change.items():
            target[key] = _merge(target[key], value) if key in target else value
        return target
    if isinstance(target, list) and isinstance(change, list) and _named(target + change):
        names = {item["name"]: item for item in target}
        for item in change:
            if item["name"] in names:
                _merge(names[item["name"]], item)
        return [item for item in change if item["name"] not in names] + target  # kustomize's order
    return change


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(item, dict) and "name" in item for item in items)
