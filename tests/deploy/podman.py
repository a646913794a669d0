"""podman, buildah and podman-compose for the container tests (docs/deployment.md, "Running the
container tests with podman").

The tests run only when asked (OPSERVE_TEST_CONTAINERS=1): they start real containers as root.
No registry may be reachable, so the base images the Dockerfile and the compose file name are
stand-ins made once from Debian's packages with mmdebstrap, under those very names."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).parents[2]
ENV = {**os.environ, "CONTAINERS_CONF": str(Path(__file__).with_name("containers.conf"))}
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# image name: (Debian packages, podman import --change)
STAND_INS = {
    "docker.io/library/python:3.11-slim": ("python3,python3-venv,python3-pip,ca-certificates", []),
    "docker.io/library/nginx:1.27": ("nginx-light,ca-certificates",
                                     ["--change", 'CMD ["nginx", "-g", "daemon off;"]']),
    # Debian 12's redis-server is Redis 7.0 (redis-cli comes with it, for the health check)
    "docker.io/library/redis:7": ("redis-server",
                                  ["--change", 'CMD ["redis-server", "--protected-mode", "no"]']),
}  # fmt: skip
TOOLS = ["podman", "buildah", "runc", "mmdebstrap", "podman-compose"]


def missing() -> str | None:
    """Why the container tests do not run here, or None."""
    if os.environ.get("OPSERVE_TEST_CONTAINERS") != "1":
        return ("starts real containers as root: run it with OPSERVE_TEST_CONTAINERS=1 (root, "
                "podman, buildah, runc, mmdebstrap; .ci/run installs them and sets it)")  # fmt: skip
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not installed (.ci/run installs them as root)"
    if os.geteuid() != 0:
        return "the container test runs podman as root (docs/deployment.md)"
    return None


def run(
    *command: str, timeout: float = 300, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A podman-family command with our CONTAINERS_CONF (and `env`), its output captured."""
    done = subprocess.run(command, env={**ENV, **(env or {})}, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def ensure_stand_ins() -> None:
    """Make the base images from Debian packages once; later runs reuse them."""
    for name, (packages, change) in STAND_INS.items():
        if run("podman", "image", "exists", name, check=False).returncode == 0:
            continue
        with tempfile.TemporaryDirectory() as scratch:
            tar = f"{scratch}/rootfs.tar"
            run("mmdebstrap", "--variant=apt", f"--include={packages}", "bookworm", tar,
                timeout=900)  # fmt: skip
            run("podman", "import", *change, tar, name)


def build(tag: str) -> None:
    """Build the project's Dockerfile (docker format: OCI images drop HEALTHCHECK)."""
    ca = ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.exists() else []
    run("buildah", "bud", "--layers", "--format", "docker", "--network", "host", *ca, "-t", tag, ".",
        timeout=900)  # fmt: skip
