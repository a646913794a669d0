"""The gRPC section of docs/v2.md as a user runs it: the KServe SDK's example in the virtualenv
tests/clients/kserve_sdk.py makes (kserve's generated messages clash with tritonclient's in one
process, and it brings many packages); the grpcurl commands when grpcurl is on the PATH
(it is not packaged by Debian or published on PyPI by its authors). The tritonclient examples
run in tests/test_docs_examples.py."""

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.api.live_server import ROOT
from tests.clients import kserve_sdk
from tests.grpc.conftest import Served, serve_grpc

GUIDE = (ROOT / "docs" / "v2.md").read_text()
SECTION = GUIDE[GUIDE.index("\n## gRPC\n") :]
KSERVE_EXAMPLE = re.findall(r"```python\n(.*?)```\n```text kserve\n(.*?)```",
                            SECTION[SECTION.index("**With the KServe SDK**") :], re.S)  # fmt: skip
GRPCURL = re.findall(r"```bash\n(grpcurl .*?)\n```\n```(?:text|json)\n(.*?)```", SECTION, re.S)


@pytest.fixture(scope="module")
def plain() -> Iterator[Served]:
    with serve_grpc() as served:
        yield served


def test_the_guide_has_the_examples() -> None:
    assert len(KSERVE_EXAMPLE) == 1 and len(GRPCURL) >= 2


def test_kserve_sdk_example_prints_as_documented(plain: Served) -> None:
    ((code, shown),) = KSERVE_EXAMPLE
    script = code.replace("localhost:8001", plain.target)
    done = subprocess.run([str(kserve_sdk.python()), "-c", script], capture_output=True, text=True,
                          timeout=120, cwd="/")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown


@pytest.mark.skipif(shutil.which("grpcurl") is None, reason="grpcurl is not on the PATH")
@pytest.mark.parametrize(("command", "shown"), GRPCURL)
def test_grpcurl_example_answers_as_documented(plain: Served, command: str, shown: str) -> None:
    words = [plain.target if w == "localhost:8001" else w for w in shlex.split(command)]
    done = subprocess.run(words, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    if shown.lstrip().startswith("{"):
        assert json.loads(done.stdout) == json.loads(shown)
    else:
        assert done.stdout == shown
