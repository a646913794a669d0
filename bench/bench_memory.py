"""Memory and speed of one large answer: peak RSS over idle as a multiple of the output, and
MB/s against a raw ASGI app answering the same bytes, in the same run.

    python bench/bench_memory.py [--mib 256] [--rounds 3]

For each case, the service (uvicorn, uvloop, httptools, pinned to core 0; limits raised for
the bench: OPSERVE_MAX_OUTPUT_BYTES, OPSERVE_MAX_ANSWER_BYTES, OPSERVE_MEMORY_BUDGET_BYTES)
answers one request producing --mib MiB. Its peak RSS (VmHWM, reset before the request) over
its idle RSS is divided by the output bytes. The answer is saved, and bench/floor_large_app.py
serves the same bytes from memory; a client pinned to core 1 reads both answers to the end
--rounds times, and the best MB/s of each are compared.

Targets: base64 TensorProto < 3x RSS and >= 0.75x the floor's MB/s; the V2 binary extension
< 1.5x and >= 0.85x. A case is one entry of CASES: its name, path, body, content type and
targets.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_http import free_port, start_server  # noqa: E402

MiB = 1024 * 1024
FLAGS = ["--loop", "uvloop", "--http", "httptools", "--workers", "1", "--log-level", "warning",
         "--no-access-log"]  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: bytes
    content_type: str
    rss_target: float  # peak RSS over idle, as a multiple of the output: below this
    speed_target: float  # MB/s as a fraction of the floor's: at least this


def cases(mib: int) -> list[Case]:
    count = mib * MiB // 4  # float32 elements
    fill = (
        '{"inputs":{"input":{"dtype":"int64","data":[' + str(count) + ']}},"attributes":{"value":'
        '{"dtype":"float","shape":[1],"data":[1.5]}},"output_format":"tensor_proto"}'
    )
    v2_fill = (
        '{"inputs":[{"name":"input","shape":[1],"datatype":"INT64","data":[' + str(count) + "]},"
        '{"name":"value","shape":[1],"datatype":"FP32","data":[1.5]}],'
        '"parameters":{"binary_data_output":true}}'
    )
    return [
        Case("tensor_proto", "/v1/ops/ConstantOfShape/25", fill.encode(), "application/json",
             3.0, 0.75),
        Case("v2_binary", "/v2/models/ConstantOfShape/versions/25/infer", v2_fill.encode(),
             "application/json", 1.5, 0.85),
    ]  # fmt: skip


def start(app: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """uvicorn serving `app` on core 0, once it listens."""
    return start_server(app, port, 0, FLAGS, env, check=False)


def fetch(port: int, case: Case, keep: bool = False) -> tuple[float, int, bytes]:
    """Seconds to read the whole answer, its size, and the body when `keep`."""
    request = (f"POST {case.path} HTTP/1.1\r\nHost: x\r\nContent-Type: {case.content_type}\r\n"
               f"Content-Length: {len(case.body)}\r\nConnection: close\r\n\r\n").encode()  # fmt: skip
    buffer = bytearray(4 * MiB)
    kept = bytearray()
    size = 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        start = time.perf_counter()
        sock.sendall(request + case.body)
        while n := sock.recv_into(buffer):
            size += n
            if keep:
                kept += buffer[:n]
        seconds = time.perf_counter() - start
    return seconds, size, bytes(kept)


def rss(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def dechunk(answer: bytes) -> tuple[bytes, bytes]:
    """Head and body of an HTTP answer, chunked transfer decoded."""
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return head, body
    out, at = bytearray(), 0
    while True:
        end = body.index(b"\r\n", at)
        length = int(body[at:end], 16)
        if length == 0:
            return head, bytes(out)
        out += body[end + 2 : end + 2 + length]
        at = end + 4 + length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.sched_setaffinity(0, {1})
    env = {"OPSERVE_MAX_OUTPUT_BYTES": str(args.mib * MiB + MiB),
           "OPSERVE_MAX_ANSWER_BYTES": str(2 * args.mib * MiB),
           "OPSERVE_MEMORY_BUDGET_BYTES": str(4 * args.mib * MiB), "OPSERVE_ACCESS_LOG": "false"}  # fmt: skip
    print(f"one answer of {args.mib} MiB of output; targets in brackets")
    for case in cases(args.mib):
        port, floor_port = free_port(), free_port()
        server = start("service.main:app", port, env)
        floor_server = None
        try:
            time.sleep(1)
            idle = rss(server.pid, "VmRSS")
            Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # reset VmHWM
            _, _, answer = fetch(port, case, keep=True)
            peak = rss(server.pid, "VmHWM") - idle
            head, body = dechunk(answer)
            assert head.startswith(b"HTTP/1.1 200"), (head, body[:300])
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as saved:
                saved.write(body)
            floor_server = start("bench.floor_large_app:app", floor_port,
                                 {"FLOOR_ANSWER_FILE": saved.name})  # fmt: skip
            os.unlink(saved.name)
            times: dict[int, list[float]] = {port: [], floor_port: []}
            for _ in range(args.rounds):  # alternate: both see the same noise of a shared machine
                for each in times:
                    times[each].append(fetch(each, case)[0])
            service, floor = min(times[port]), min(times[floor_port])
        finally:
            for each in (server, floor_server):
                if each is not None:
                    each.terminate()
                    each.wait()
        ratio = peak / (args.mib * MiB)
        mbps, floor_mbps = len(body) / service / 1e6, len(body) / floor / 1e6
        print(f"{case.name}: answer {len(body) / MiB:.0f} MiB; peak RSS over idle "
              f"{peak / MiB:.0f} MiB = {ratio:.2f}x the output [< {case.rss_target}x]; "
              f"{mbps:.0f} MB/s vs floor {floor_mbps:.0f} MB/s = {mbps / floor_mbps:.2f}x "
              f"[>= {case.speed_target}x]")  # fmt: skip


if __name__ == "__main__":
    main()
