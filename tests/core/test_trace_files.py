"""core/trace_files.py: the trace file stays one whole JSON array after each append, groups go
to numbered files, and writes waiting past the bound are dropped rather than held."""

import json
import threading
from pathlib import Path

import pytest

from service.core import trace_files
from service.core.trace_files import TraceFile


def test_the_file_is_a_whole_array_after_each_append(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text("left from an earlier start")
    file = TraceFile(str(path))
    seen = []
    for n in range(3):
        file.append(b'{"id":%d},{"id":%d,"timestamps":[]}' % (n, n))
        file.writer.submit(lambda: seen.append(json.loads(path.read_bytes()))).result()
    file.save_group([b'{"id":7}', b'{"id":8}'])
    file.close()
    assert [len(array) for array in seen] == [2, 4, 6]
    assert [entry["id"] for entry in seen[-1]] == [0, 0, 1, 1, 2, 2]
    assert json.loads((tmp_path / "trace.json.0").read_bytes()) == [{"id": 7}, {"id": 8}]
    file.append(b'{"id":9}')  # after the close (a late request): dropped, not raised


def test_writes_past_the_bound_are_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_files, "MAX_PENDING", 3)
    path = tmp_path / "trace.json"
    file = TraceFile(str(path))
    held = threading.Event()
    file.writer.submit(held.wait)  # the disk "falls behind"
    for n in range(5):
        file.append(b'{"id":%d}' % n)
    assert file.dropped == 2
    held.set()
    file.close()
    assert [entry["id"] for entry in json.loads(path.read_bytes())] == [0, 1, 2]
