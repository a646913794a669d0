"""Codec throughput for a 64 MiB float32 tensor, against a plain memory copy of the same run.

Run: python bench/bench_codecs.py [--mib 64] [--reps 5]

Each figure is the best of N runs, in seconds and MiB/s of tensor data (64 MiB of float32
however large the wire form is), and as a ratio to np.copyto of the same 64 MiB into a fresh
buffer. The JSON form is timed on its whole path (bytes -> JsonTensor.model_validate_json
-> decode_json; encode_json -> orjson.dumps), with fewer runs as it is slow. The memory
section shows that the proto decode keeps one payload-sized copy: tracemalloc's peak, the
process's peak RSS in a fresh interpreter, and that the array is a view of raw_data.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api_schemas.tensors import JsonTensor
from service.codecs.json_encode import encode_json
from service.codecs.json_tensor import decode_json
from service.codecs.limits import Limits
from service.codecs.tensor_proto import decode_tensor_proto, encode_tensor_proto

MIB = 1024 * 1024
LIMITS = Limits(max_elements=2**31)


def best_of(reps: int, fn: Callable[[], Any]) -> float:
    """Best wall time of `reps` calls; the result is dropped before the next call."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def fresh_copy(array: np.ndarray) -> np.ndarray:
    out = np.empty_like(array)
    np.copyto(out, array)
    return out


def json_decode(body: bytes) -> np.ndarray:
    return decode_json(parse(body), LIMITS)


def parse(body: bytes) -> JsonTensor:
    return JsonTensor.model_validate_json(body)


def json_encode(array: np.ndarray) -> bytes:
    return orjson.dumps(encode_json(array), option=orjson.OPT_SERIALIZE_NUMPY)


def timings(array: np.ndarray, reps: int) -> list[tuple[str, float, int]]:
    """(label, seconds, wire bytes) per path, the copy baseline first."""
    body = json_encode(array)
    payload = encode_tensor_proto(array)
    json_reps = max(1, reps // 2)
    parsed = parse(body)
    return [
        ("np.copyto, fresh buffer", best_of(reps, lambda: fresh_copy(array)), array.nbytes),
        ("proto decode (base64 str)", best_of(reps, lambda: decode_tensor_proto(payload, LIMITS)),
         len(payload)),
        ("proto encode (to base64)", best_of(reps, lambda: encode_tensor_proto(array)),
         len(payload)),
        ("JSON decode (bytes -> array)", best_of(json_reps, lambda: json_decode(body)), len(body)),
        ("JSON encode (array -> bytes)", best_of(json_reps, lambda: json_encode(array)), len(body)),
        # where the JSON decode time goes
        ("  of which model_validate_json", best_of(json_reps, lambda: parse(body)), len(body)),
        ("  of which decode_json", best_of(json_reps, lambda: decode_json(parsed, LIMITS)),
         len(body)),
    ]  # fmt: skip


def print_table(rows: list[tuple[str, float, int]], nbytes: int) -> None:
    base = rows[0][1]
    print(f"{'path':<30} {'best s':>8} {'MiB/s':>9} {'x copy':>8} {'wire MiB':>9}")
    for label, seconds, wire in rows:
        print(f"{label:<30} {seconds:>8.4f} {nbytes / MIB / seconds:>9.0f} "
              f"{seconds / base:>8.1f} {wire / MIB:>9.1f}")  # fmt: skip


def memory(array: np.ndarray) -> None:
    payload = encode_tensor_proto(array)
    tracemalloc.start()
    decoded = decode_tensor_proto(payload, LIMITS)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    base: object = decoded
    while isinstance(base, np.ndarray):
        base = base.base
    print(f"tracemalloc peak during decode_tensor_proto: {peak / MIB:.1f} MiB "
          f"= {peak / array.nbytes:.2f} x the {array.nbytes // MIB} MiB tensor")  # fmt: skip
    size = len(base) // MIB if isinstance(base, bytes) else "?"
    print(f"decoded array is a view of {type(base).__name__} of {size} MiB "
          f"(raw_data, np.frombuffer, no copy): {isinstance(base, bytes)}; "
          f"equal to the input: {np.array_equal(decoded, array)}")  # fmt: skip
    growth = rss_growth(payload)
    if growth is None:
        print("peak RSS of decode: not measurable here (needs Linux /proc/self/clear_refs)")
        return
    print(f"RSS of decode in a fresh interpreter: peak +{growth[0] / MIB:.0f} MiB "
          f"= {growth[0] / array.nbytes:.2f} x tensor (protobuf's own copy of the message "
          f"is outside tracemalloc), kept +{growth[1] / MIB:.0f} MiB (the array)")  # fmt: skip


# Linux: VmHWM is the peak RSS, and writing 5 to clear_refs resets it to the current RSS
# (getrusage's ru_maxrss cannot be reset and is inherited from the parent across exec).
_RSS_CHILD = """
import sys
from service.codecs.limits import Limits
from service.codecs.tensor_proto import decode_tensor_proto
def kib(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))
payload = open(sys.argv[1], "rb").read()
open("/proc/self/clear_refs", "w").write("5")
before = kib("VmRSS")
array = decode_tensor_proto(payload, Limits(max_elements=2**31))
print(kib("VmHWM") - before, kib("VmRSS") - before)
"""


def rss_growth(payload: str) -> tuple[int, int] | None:
    """Peak and kept RSS added by one decode, in a child holding only the payload before."""
    path = Path(tempfile.gettempdir()) / f"bench_codecs_{os.getpid()}.b64"
    path.write_text(payload)
    try:
        root = str(Path(__file__).resolve().parents[1])
        out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(path)], cwd=root,
                             check=False, capture_output=True, text=True)  # fmt: skip
        if out.returncode:  # not Linux, or clear_refs not writable
            return None
        peak, kept = out.stdout.split()
        return int(peak) * 1024, int(kept) * 1024
    finally:
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="tensor size in MiB (float32)")
    parser.add_argument("--reps", type=int, default=5, help="runs per figure (JSON: half)")
    args = parser.parse_args()
    array = np.random.default_rng(0).standard_normal(args.mib * MIB // 4, dtype=np.float32)
    print(f"float32 tensor of {array.size} elements ({array.nbytes // MIB} MiB), "
          f"best of {args.reps} (JSON: best of {max(1, args.reps // 2)})\n")  # fmt: skip
    print_table(timings(array, args.reps), array.nbytes)
    print()
    memory(array)


if __name__ == "__main__":
    main()
