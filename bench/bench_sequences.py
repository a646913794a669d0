"""A sequence step in one process against cluster mode (issue 26, item 6), ratios in one run.

    python bench/bench_sequences.py [--steps 300] [--rounds 3]

1. Over HTTP: Triton's accumulator (simple_string_dyna_sequence, implicit state) stepped with
   tritonclient.http (binary tensors, one keep-alive connection), against an opserve process
   alone and against one in cluster mode on a local Redis (append-only, fsync every second, as
   docs/deployment.md advises); the rounds alternate between the two so both see the same
   machine. Median and p99 of a step's time, and the cluster's over one process's. The floor
   (bench/floor_sequences.py): the one-process turn plus two round trips to the same Redis (a
   script that only answers), what two round trips cost on this host whatever the scripts and
   bookkeeping do; "1 trip" the same with one: what a one-round-trip step would cost at best.
   Redis's own count of the commands it ran meanwhile (INFO commandstats) per cluster step:
   two round trips (EVALSHA) when uncontended, the exactly-once token and fingerprint riding on
   them (issue 32, item 1), the commands the scripts ran, and Redis's time in them; the
   heartbeat's few calls count too.
2. In process: the bookkeeping alone (a turn entered, its inputs, the state kept, the turn left,
   no model run) of core/sequences.py's Sequences against service/cluster's ClusterSequences on
   the same Redis: what the two round trips cost.
"""

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tritonclient.http as httpclient

from service.cluster.members import Membership
from service.cluster.sequences import ClusterSequences
from service.cluster.store import ClusterStore
from service.core.sequence_claims import CountedClaims
from service.core.sequence_request import SequenceRequest
from service.core.sequences import Sequences
from tests.api.live_server import free_port, serve
from tests.core.test_sequences import accumulate, dyna_plan
from tests.triton_examples import write_repository

MODEL = "simple_string_dyna_sequence"


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--loglevel", "warning"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


def http_steps(port: int, steps: int, seq_id: str) -> list[float]:
    """Seconds of each step after a START, over one keep-alive connection."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    data = httpclient.InferInput("INPUT", [1, 1], "INT32")
    data.set_data_from_numpy(np.ones((1, 1), np.int32), binary_data=True)
    wanted = [httpclient.InferRequestedOutput("OUTPUT", binary_data=True)]
    client.infer(MODEL, [data], sequence_id=seq_id, sequence_start=True, outputs=wanted)
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        client.infer(MODEL, [data], sequence_id=seq_id, outputs=wanted)
        times.append(time.perf_counter() - began)
    client.infer(MODEL, [data], sequence_id=seq_id, sequence_end=True, outputs=wanted)
    client.close()
    return times


async def turn_steps(keeper: Sequences | ClusterSequences, steps: int, seq_id: int) -> list[float]:
    """Seconds of each turn's bookkeeping (no model run) after a START."""
    plan, value = dyna_plan(), {"INPUT": np.ones((1, 1), np.int32)}
    times = []
    for i in range(steps + 1):
        began = time.perf_counter()
        async with keeper.turn(plan.model_name, plan, SequenceRequest(seq_id, i == 0)) as turn:
            turn.keep(accumulate(turn.inputs() | value))
        times.append(time.perf_counter() - began)
    return times[1:]


async def in_process(url: str, steps: int, rounds: int) -> dict[str, list[float]]:
    store = ClusterStore(url, "bench", 1.0)
    members = Membership(store, 1.0)
    await members.beat()
    found: dict[str, list[float]] = {"one process": [], "cluster": []}
    keepers = {"one process": Sequences(100), "cluster": ClusterSequences(
        store, members, CountedClaims(), 3.0)}  # fmt: skip
    for r in range(rounds):
        for name, keeper in keepers.items():
            found[name] += await turn_steps(keeper, steps, 1000 + r)
    await store.close()
    return found


def commands(url: str) -> dict[str, tuple[int, int]]:
    """Calls of each command Redis ran so far, and microseconds in them (INFO commandstats)."""
    with redis.Redis.from_url(url) as client:
        found = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(row["calls"]), int(row["usec"]))
            for name, row in found.items()}  # fmt: skip


def report(title: str, found: dict[str, list[float]]) -> None:
    base = found["one process"]
    print(f"\n{title}")
    for name, times in found.items():
        median, p99 = statistics.median(times), np.percentile(times, 99)
        print(f"  {name:12s} median {median * 1e3:7.3f} ms  p99 {p99 * 1e3:7.3f} ms  "
              f"x{median / statistics.median(base):5.2f} (median)  "
              f"x{p99 / np.percentile(base, 99):5.2f} (p99)  n={len(times)}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("needs redis-server (apt-get install redis-server)")
    with tempfile.TemporaryDirectory() as folder, redis_server(Path(folder)) as url:
        root = write_repository(Path(folder) / "models", [MODEL])
        common = {"model_repository": str(root), "reference_fallback": "true", "grpc_port": "0",
                  "access_log": "false"}  # fmt: skip
        clustered = {"cluster_redis_url": url, **common}
        with (serve(**common) as alone, serve(**clustered) as cluster,
              serve(module="bench.floor_sequences", **clustered) as floor,
              serve("--round-trips", "1", module="bench.floor_sequences",
                    **clustered) as floor1):  # fmt: skip
            found: dict[str, list[float]] = {"one process": [], "cluster": [], "floor": [],
                                             "1 trip": []}  # fmt: skip
            ran: dict[str, list[int]] = {}
            for r in range(args.rounds):
                found["one process"] += http_steps(alone.port, args.steps, str(1000 + r))
                before = commands(url)
                found["cluster"] += http_steps(cluster.port, args.steps, str(2000 + r))
                for name, (calls, usec) in commands(url).items():
                    was = before.get(name, (0, 0))
                    ran.setdefault(name, [0, 0])
                    ran[name][0] += calls - was[0]
                    ran[name][1] += usec - was[1]
                found["floor"] += http_steps(floor.port, args.steps, str(3000 + r))
                found["1 trip"] += http_steps(floor1.port, args.steps, str(4000 + r))
        report("a step over tritonclient.http (binary), server and Redis on this machine", found)
        steps = args.rounds * (args.steps + 2)  # with each round's START and END
        evalsha = ran.get("evalsha", [0, 0])
        print(f"  per cluster step: {evalsha[0] / steps:.2f} round trips (EVALSHA), "
              f"{evalsha[1] / steps:.0f} us of Redis's time in them; "
              f"{sum(calls for calls, _ in ran.values()) / steps:.1f} commands run by Redis, "
              "those inside the scripts included: " + ", ".join(
                  f"{name} {calls / steps:.2f}"
                  for name, (calls, _) in sorted(ran.items()) if calls))  # fmt: skip
        report("the turn alone, in process (no model run)",
               asyncio.run(in_process(url, args.steps, args.rounds)))  # fmt: skip


if __name__ == "__main__":
    main()
