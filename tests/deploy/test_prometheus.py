"""The shipped Prometheus configuration and Grafana dashboard against a real Prometheus (Debian's
`prometheus`, which .ci/run installs) scraping two real replicas: Prometheus finds the metric
names the dashboard reads, the cluster's counts add up exactly across the replicas, and every
panel's query is valid PromQL that answers (the rate and latency panels with a value, once
traffic has flowed). The compose profile runs `prom/prometheus`, which this machine cannot pull
(no registry); the configuration it mounts is the one tested here, with only its targets
pointed at the test's replicas (compose names them app1..app3)."""

import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from tests.api.live_server import free_port, serve, stop_process
from tests.triton_examples import write_repository

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "opserve.json"
RATE_INTERVAL = "30s"  # Grafana's $__rate_interval for a 1 s scrape is shorter; 30 s spans the run

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus is not on the PATH (apt-get install prometheus)")  # fmt: skip


def _body(first: int) -> dict:
    data = list(range(first, first + 16))
    return {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": data},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": data}]}  # fmt: skip


@contextmanager
def prometheus(tmp_path: Path, targets: list[str]) -> Iterator[str]:
    """Prometheus with the shipped configuration, its targets replaced by `targets` and its
    intervals shortened to 1 s; yields its URL once it answers."""
    config = yaml.safe_load(CONFIG.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": targets}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen(
        ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"))  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "prometheus did not start within 30 s"
            time.sleep(0.1)
        yield url
    finally:
        stop_process(process)


def query(url: str, expr: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def _until(url: str, expr: str, want: float, seconds: float = 40) -> float:
    deadline = time.monotonic() + seconds
    got = math.nan
    while time.monotonic() < deadline:
        result = query(url, expr)
        got = float(result[0]["value"][1]) if result else math.nan
        if got == want:
            break
        time.sleep(0.25)
    return got


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every dashboard query, Grafana's variables filled in."""
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
            found.append((panel["title"], expr.replace("$model", ".*")))
    return found


def test_prometheus_scrapes_every_replica_and_every_panel_answers(tmp_path: Path) -> None:
    root = write_repository(tmp_path / "repository", ["simple"])
    sent = {0: 0, 1: 0}
    failed = 0
    with ExitStack() as stack:
        replicas = [stack.enter_context(serve(model_repository=str(root), access_log="false"))
                    for _ in sent]  # fmt: skip
        url = stack.enter_context(
            prometheus(tmp_path, [f"127.0.0.1:{replica.port}" for replica in replicas])
        )
        up = _until(url, 'sum(up{job="opserve"})', 2)
        assert up == 2, "prometheus did not find both replicas up"
        # traffic over a few scrapes, so that the rate panels see counters grow
        with httpx.Client(timeout=10) as client:
            began = time.monotonic()
            turn = 0
            while time.monotonic() - began < 4 or turn < 40:
                which = turn % 2
                answer = client.post(f"{replicas[which].url}/v2/models/simple/infer",
                                     json=_body(turn))  # fmt: skip
                assert answer.status_code == 200, answer.text
                sent[which] += 1
                if turn % 10 == 0:  # a failure now and then (a wrong shape: 400)
                    bad = client.post(f"{replicas[which].url}/v2/models/simple/infer",
                                      json={"inputs": _body(turn)["inputs"][:1]})  # fmt: skip
                    assert bad.status_code == 400
                    failed += 1
                turn += 1
                time.sleep(0.05)
        total = sum(sent.values())
        # the cluster's counts are the replicas' sums, under the dashboard's names and labels
        assert _until(url, 'sum(nv_inference_request_success{model="simple"})', total) == total
        assert _until(url, 'sum(nv_inference_request_failure{model="simple"})', failed) == failed
        by_replica = query(url, 'sum by (instance) (nv_inference_count{model="simple"})')
        counts = {row["metric"]["instance"]: float(row["value"][1]) for row in by_replica}
        assert counts == {f"127.0.0.1:{r.port}": float(sent[i]) for i, r in enumerate(replicas)}
        buckets = query(
            url, 'sum(opserve_inference_request_duration_seconds_count{model="simple"})'
        )
        assert float(buckets[0]["value"][1]) == total  # the histogram counts every success
        # the dashboard's model picker
        picker = httpx.get(f"{url}/api/v1/label/model/values",
                           params={"match[]": "nv_inference_request_success"}).json()  # fmt: skip
        assert picker["data"] == ["simple"]
        # every panel's query is valid PromQL; those over the traffic answer with a value
        answered = {}
        for title, expr in panel_queries():
            values = [float(row["value"][1]) for row in query(url, expr)]
            answered[(title, expr)] = values
        for (title, expr), values in answered.items():
            if "nv_cache" in expr or "failure" in expr or "pending" in expr:
                continue  # no cached model here; failures' rate may have left the window
            assert values, f"panel {title!r} answered nothing: {expr}"
            assert all(math.isfinite(v) and v >= 0 for v in values), (title, expr, values)
        latency = [v for (title, expr), v in answered.items()
                   if "0.99" in expr and "request_duration" in expr]  # fmt: skip
        assert latency and 0 < latency[0][0] < 60  # a p99 in seconds, from both replicas' buckets
