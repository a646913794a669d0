"""api_schemas is the wire contract for client services: it must import without the server."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]

CHECK = """
import sys
import api_schemas, api_schemas.requests, api_schemas.responses, api_schemas.catalog
import api_schemas.operators.constant, api_schemas.operators.constant_of_shape
import api_schemas.operators.random_uniform_like, api_schemas.operators.shape
import api_schemas.operators.tile, api_schemas.v2
heavy = sorted(m for m in ("fastapi", "starlette", "numpy", "onnx", "ml_dtypes", "service")
               if m in sys.modules)
print(",".join(heavy))
"""


def test_api_schemas_imports_only_pydantic_and_the_standard_library() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == "", f"api_schemas pulled in: {done.stdout.strip()}"


def test_a_client_can_build_and_validate_a_request() -> None:
    from api_schemas.operators.tile import TileRequestV6

    request = TileRequestV6.model_validate({
        "inputs": {"input": {"dtype": "float", "shape": [2], "data": [1, 2]},
                   "repeats": {"tensor_proto": "CAEQB0oIAgAAAAAAAAA="}},
    })  # fmt: skip
    assert request.output_format == "json"
    assert request.inputs.repeats.tensor_proto == "CAEQB0oIAgAAAAAAAAA="  # type: ignore[union-attr]
