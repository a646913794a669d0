"""CPU instructions per request of the service's own code, counted by valgrind's callgrind, in
process, for the small Tile-13 request of bench_http.py on each HTTP lane (v1, V2 JSON, V2
binary), for this tree and optionally for a baseline git revision, in one run.

    python bench/bench_instructions.py [--lanes v1,v2,v2-binary] [--calls 1000] [--jobs 2]
    python bench/bench_instructions.py --lanes v1,v2 --baseline HEAD~1

Each lane of each tree runs in a child process of this script under
`valgrind --tool=callgrind --collect-atstart=no`: the child builds the app as bench_inprocess.py
does (access log on, to /dev/null), makes 300 warm-up calls through its ASGI entry, then turns
collection on, drives `--calls` calls synchronously (the small calls never suspend) and turns it
off, through a tiny C library of callgrind's client requests compiled at run time (cc, and
valgrind's <valgrind/callgrind.h>). The dump's total over the calls gives the instructions per
call; `--baseline REV` measures REV's service from a temporary git worktree the same way, and
the ratio is this tree's over the baseline's (lower is better).

Why: on this VM timings move by up to 2x between minutes (hypervisor steal), while callgrind's
counts repeat: the same tree measured in two runs counted within 0.1% of itself, the same
commit in two checkouts within 0.25% (the heap's layout, which the paths and files differ in,
decides some of the interpreter's type-cache misses; see _links and _byte_compile).
So a change of a percent or more on the hot path shows here when bench_inprocess.py cannot tell
it from noise. Instructions are not time: the C code of numpy, pydantic-core and orjson counts
like the interpreter's, and cache misses, branch mispredictions and page faults do not count at
all; confirm a win in time before believing it is one. Under valgrind a child's start-up
(imports) takes about 2 minutes; the calls themselves add little. `--dumps DIR` keeps callgrind's
dumps, for callgrind_annotate.
"""

import argparse
import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # bench.*, whatever the directory it is run from

# bench_inprocess's calls and bench_http's requests, so all three benches make the same calls
# (neither imports anything of service, which the child takes from the tree it measures)
from bench.bench_http import LANES, worktree  # noqa: E402
from bench.bench_inprocess import _caller, _check  # noqa: E402

HTTP_LANES = ("v1", "v2", "v2-binary")
WARM_UP = 300
HEADER = Path("/usr/include/valgrind/callgrind.h")
CONTROL_SOURCE = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void cg_stop(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS; }
"""
"""Callgrind's client requests as functions ctypes can call: outside valgrind they do nothing."""
INSTALL = "apt-get install valgrind gcc"


@dataclass(frozen=True)
class Job:
    lane: str
    side: str  # "tree" or "baseline"
    tree: Path
    folder: Path  # the child's dump, log and metrics directory


def _count(lane: str, calls: int, control: ctypes.CDLL) -> None:
    """In the child: warm-up calls, then `calls` calls of `lane` between cg_start and cg_stop."""
    import uvloop

    from service.main import create_app
    from service.settings import Settings

    path, body = LANES[lane]
    app = create_app(Settings(grpc_port=0))

    def drive(call: Callable[[], Awaitable[None]]) -> None:
        # no event loop turn between calls: what callgrind counts is the calls' own code
        for _ in range(calls):
            step = cast(Coroutine[Any, Any, None], call())
            try:
                step.send(None)
            except StopIteration:
                continue
            step.close()
            raise RuntimeError(f"a {lane} call suspended: it cannot be driven synchronously")

    async def run() -> None:
        async with app.router.lifespan_context(app):
            call, statuses = _caller(app, path, body)
            for _ in range(WARM_UP):
                await call()
            control.cg_start()
            try:
                drive(call)
            finally:
                control.cg_stop()
            _check(path, statuses)

    # the access log on, as the service runs by default, its lines to /dev/null
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        uvloop.run(run())


def _child(lane: str, tree: str, calls: str, library: str) -> None:
    sys.path.insert(0, tree)  # before ROOT: the tree's `service` wins; as given (see _links)
    _count(lane, int(calls), ctypes.CDLL(library))


def _missing() -> str | None:
    """What of valgrind, cc and callgrind.h is missing (None: nothing)."""
    missing = [name for name in ("valgrind", "cc") if shutil.which(name) is None]
    if not HEADER.exists():
        missing.append(str(HEADER))
    if not missing:
        return None
    return f"{', '.join(missing)} not found: callgrind counts the instructions ({INSTALL})"


def _compile(folder: Path) -> Path:
    source, library = folder / "cgctl.c", folder / "cgctl.so"
    source.write_text(CONTROL_SOURCE)
    built = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)],
                           capture_output=True, text=True)  # fmt: skip
    if built.returncode:
        raise RuntimeError(f"cc could not build {source}:\n{built.stderr}")
    return library


def _start(job: Job, calls: int, library: Path) -> subprocess.Popen[bytes]:
    job.folder.mkdir()
    (job.folder / "metrics").mkdir()
    # a fixed hash seed: dicts and sets probe the same way in every child
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPSERVE_METRICS_DIR": str(job.folder / "metrics")}
    command = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               f"--callgrind-out-file={job.folder / 'cg.out'}", sys.executable,
               str(Path(__file__).resolve()), "--child", job.lane, str(job.tree), str(calls),
               str(library)]  # fmt: skip
    with open(job.folder / "log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(command, cwd=job.tree, env=env, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip


def _instructions(job: Job, status: int) -> int:
    """The instructions of the child's counted calls, from callgrind's dump at cg_stop."""
    dump = job.folder / "cg.out.1"  # .1: the first dump; the one at exit has the name bare
    if status or not dump.exists():
        tail = (job.folder / "log").read_text(errors="replace").splitlines()[-25:]
        raise RuntimeError(f"{job.side} {job.lane}: the child exited with {status}"
                           f" and no dump; its last lines:\n" + "\n".join(tail))  # fmt: skip
    for line in dump.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"{job.side} {job.lane}: no summary line in {dump}")


def _run(jobs: list[Job], calls: int, library: Path, width: int,
         dumps: Path | None) -> dict[tuple[str, str], float]:  # fmt: skip
    """Instructions per call of each job's (lane, side), at most `width` children at a time."""
    waiting = list(jobs)
    running: dict[subprocess.Popen[bytes], Job] = {}
    per_call: dict[tuple[str, str], float] = {}
    started = time.monotonic()
    try:
        while waiting or running:
            while waiting and len(running) < width:
                job = waiting.pop(0)
                running[_start(job, calls, library)] = job
            time.sleep(0.5)
            for child, job in list(running.items()):
                if child.poll() is None:
                    continue
                del running[child]
                total = _instructions(job, child.returncode)
                per_call[job.lane, job.side] = total / calls
                if dumps is not None:
                    shutil.copy(job.folder / "cg.out.1", dumps / f"{job.side}-{job.lane}.cg.out")
                print(f"  {job.side} {job.lane}: {total / calls:,.0f} instructions per call"
                      f" ({time.monotonic() - started:.0f} s)", file=sys.stderr)  # fmt: skip
    finally:
        for child in running:  # after an error or ^C: no valgrind left behind
            child.kill()
            child.wait()
    return per_call


def _links(folder: Path, trees: dict[str, Path]) -> dict[str, Path]:
    """Each tree as a symbolic link in `folder`, all names as long as each other ("tree",
    "base"): the children see paths of the same length in sys.path, modules' __file__, argv and
    the environment. The heap's layout follows those lengths, and with it the work of malloc and
    of the interpreter's type cache: the same commit measured from two checkouts whose paths
    differed in length counted 0.6% more instructions per v1 call in one than in the other."""
    links = {}
    for side, tree in trees.items():
        links[side] = folder / side[:4]
        links[side].symlink_to(tree, target_is_directory=True)
    return links


def _byte_compile(tree: Path) -> None:
    """The tree's packages compiled to __pycache__ beforehand: a child that compiles modules from
    source at import (a fresh worktree does) lays out its heap otherwise than one that loads
    them, and the addresses of the interned names decide the interpreter's type-cache misses."""
    packages = [str(tree / name) for name in ("service", "api_schemas") if (tree / name).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def _git(*args: str) -> str:
    found = subprocess.run(["git", "--no-optional-locks", *args], cwd=ROOT, capture_output=True,
                           text=True)  # fmt: skip
    return found.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", default=",".join(HTTP_LANES),
                        help=f"comma-separated: {', '.join(HTTP_LANES)}")  # fmt: skip
    parser.add_argument("--calls", type=int, default=1000, help="counted calls per lane")
    parser.add_argument("--baseline", metavar="REV", help="also measure the service at REV")
    parser.add_argument("--jobs", type=int, default=2, help="children under valgrind at a time")
    parser.add_argument("--dumps", type=Path, metavar="DIR",
                        help="keep each callgrind dump in DIR, for callgrind_annotate")  # fmt: skip
    parser.add_argument("--child", nargs=4, metavar=("LANE", "TREE", "CALLS", "LIB"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    lanes = [lane.strip() for lane in args.lanes.split(",") if lane.strip()]
    if unknown := [lane for lane in lanes if lane not in HTTP_LANES]:
        parser.error(f"unknown lanes {unknown}: choose from {', '.join(HTTP_LANES)}")
    if args.calls < 1 or args.jobs < 1:
        parser.error("--calls and --jobs must be at least 1")
    if missing := _missing():
        print(missing, file=sys.stderr)
        raise SystemExit(2)
    if args.dumps is not None:
        args.dumps.mkdir(parents=True, exist_ok=True)

    head = _git("rev-parse", "--short", "HEAD") or "?"
    # what the children import of the tree: edits elsewhere (docs, benches) change no count
    if _git("status", "--porcelain", "--untracked-files=no", "--", "service", "api_schemas"):
        head += " with uncommitted changes to service/ or api_schemas/"
    baseline = ""
    if args.baseline:
        commit = _git("rev-parse", "--short", "--verify", "--quiet", f"{args.baseline}^{{commit}}")
        if not commit:
            parser.error(f"--baseline {args.baseline}: no such revision")
        baseline = f", baseline {args.baseline} ({commit})"
    print(f"tree {head}{baseline}; callgrind, {args.calls} calls per lane after {WARM_UP}"
          f" warm-up calls; instructions per call", flush=True)  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as scratch:
        folder = Path(scratch)
        library = _compile(folder)
        with worktree(args.baseline) as base:
            trees = _links(folder, {"tree": ROOT} | ({"baseline": base} if base else {}))
            for tree in trees.values():
                _byte_compile(tree)
            jobs = [Job(lane, side, tree, folder / f"{lane}-{tree.name}")
                    for lane in lanes for side, tree in trees.items()]  # fmt: skip
            per_call = _run(jobs, args.calls, library, args.jobs, args.dumps)

    print(f"{'lane':10} {'tree':>10} {'baseline':>10} {'ratio':>7}")
    for lane in lanes:
        mine, theirs = per_call[lane, "tree"], per_call.get((lane, "baseline"))
        if theirs is None:
            print(f"{lane:10} {mine:10,.0f}")
        else:
            print(f"{lane:10} {mine:10,.0f} {theirs:10,.0f} {mine / theirs:7.3f}")


if __name__ == "__main__":
    main()
