"""docs/deployment.md's plain-process cluster recipe (a redis-server and two `opserve`), run as
written by bash, on free ports in place of the doc's, in its own process group: every process it
starts is stopped at the end however the test ends. The answers are checked against values
computed here (simple_sequence: READY * (INPUT + START); tile_shape: x tiled [2, 1])."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.live_server import ROOT, free_port

DOC = (ROOT / "docs" / "deployment.md").read_text()
PORTS = ("6380", "8100", "8101", "8200", "8201")  # the doc's, each replaced by a free one


def _recipe() -> str:
    start = DOC.index("- **Plain processes**")
    (block,) = re.findall(r"```bash\n(.*?)```", DOC[start : DOC.index("- **Start-up checks", start)],
                          re.S)  # fmt: skip
    return "\n".join(line.removeprefix("  ") for line in block.splitlines())


def test_the_recipe_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None or shutil.which("curl") is None:
        pytest.skip("needs redis-server and curl")
    recipe = _recipe()
    for port in PORTS:
        assert port in recipe
        recipe = re.sub(rf"\b{port}\b", str(free_port()), recipe)
    assert "opserve &" in recipe and "kill %1 %2 %3" in recipe
    # `opserve` as the console script names it: this tree's, on the venv's python
    (tmp_path / "opserve").write_text(f'#!/bin/sh\nexec {sys.executable} -m service "$@"\n')
    (tmp_path / "opserve").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPSERVE_LOG_LEVEL": "warning",
           "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    process = subprocess.Popen(["bash", "-c", "set -m\n" + recipe], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        out, _ = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever the recipe left: nothing if it ran
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == 0, out
    ours = [line for line in out.splitlines() if not re.match(r"\d+:[A-Z] |\d+:signal", line)]
    ready, load, tile, *steps = ours[-7:]  # redis-server's own lines left out
    assert ready.endswith('{"ready":true}{"ready":true}'), out  # both replicas
    assert load == "", out  # a load that worked answers an empty body
    y = {o["name"]: o for o in json.loads(tile)["outputs"]}["y"]
    assert y["shape"] == [2, 3] and y["data"] == [1, 2, 3, 1, 2, 3]
    answers = [json.loads(step) for step in steps]
    outputs = [a["outputs"][0]["data"] for a in answers[:3]]
    inputs, starts = [5, 3, 4], [1, 0, 0]
    assert outputs == [[i + s] for i, s in zip(inputs, starts, strict=True)]  # READY is 1
    assert "error" in answers[3], answers[3]  # after END: no such sequence any more
