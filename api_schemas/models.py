"""Bodies of the v1 model routes: run a posted or a repository model, list the repository."""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api_schemas.requests import OutputFormat
from api_schemas.tensors import Tensor

EXAMPLE_MODEL = (
    "CAoSDG9wc2VydmUtZG9jczq3AQobCgF4CgdyZXBlYXRzEgF5GgR0aWxlIgRUaWxlChgKAXkSBXNoYXBlGgVzaGFwZSIF"
    "U2hhcGUSCnRpbGVfc2hhcGUqHwgCEAdCB3JlcGVhdHNKEAIAAAAAAAAAAQAAAAAAAABaFAoBeBIPCg0IARIJCgMSAW4K"
    "AggDWhUKB3JlcGVhdHMSCgoICAcSBAoCCAJiDwoBeRIKCggIARIECgAKAGITCgVzaGFwZRIKCggIBxIECgIIAkIECgAQ"
    "FQ=="
)
"""A two-node model (opset 21): y = Tile(x, repeats), shape = Shape(y); x is float [n, 3] and
repeats an int64 [2] input whose initializer defaults it to [2, 1]."""

_X: dict[str, Any] = {"dtype": "float", "shape": [1, 3], "data": [1, 2, 3]}
_OPTIONS_EXAMPLE: dict[str, Any] = {
    "inputs": {"x": _X},
    "outputs": ["y", "shape"],
    "output_format": "json",
}


class ModelRunOptions(BaseModel):
    """What to feed a model and what to return; the body of a repository model's run."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_OPTIONS_EXAMPLE]})

    inputs: dict[str, Tensor] = Field(
        default_factory=dict,
        description="Graph inputs by name. An input with an initializer may be left out: the "
        "initializer is its default.",
    )
    outputs: list[str] | None = Field(
        default=None, description="Graph outputs to return (all by default); only the nodes "
        "they need run.", examples=[["y"]],
    )  # fmt: skip
    output_format: OutputFormat = Field(
        default="json", description="Form of the output tensors: json or tensor_proto."
    )
    trace: bool = Field(default=False, description="Also return every intermediate value.")


class PostedRunOptions(ModelRunOptions):
    """The options of a posted model's run: those of a repository model's, and its engine."""

    engine: Literal["exact", "onnxruntime"] = Field(
        default="exact", description="`exact`: the service's kernels (and onnx.reference with "
        "OPSERVE_REFERENCE_FALLBACK); `onnxruntime`: one onnxruntime session, kept by the "
        "model's digest. A trace always runs on the exact engine (docs/models.md)."
    )  # fmt: skip


class ModelRunRequest(PostedRunOptions):
    """Run a model sent in the body. As multipart/form-data, `model` is a file part and the
    other fields go, as one JSON object, in the form field `request`."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "model": EXAMPLE_MODEL, **_OPTIONS_EXAMPLE,
    }]})  # fmt: skip

    model: str = Field(description="base64 of a serialized onnx.ModelProto (external data "
                       "refused)", examples=[EXAMPLE_MODEL])  # fmt: skip


class NodeRun(BaseModel):
    """A node that ran: its schema version, and on what."""

    name: str = Field(examples=["tile"])
    op_type: str = Field(examples=["Tile"])
    domain: str = Field(examples=[""])
    version: int | None = Field(description="since_version of the schema that ran",
                                examples=[13])  # fmt: skip
    ran_on: Literal["kernel", "reference", "onnxruntime"] = Field(
        description="`kernel`: the service's own kernels; `reference`: onnx.reference "
        "(OPSERVE_REFERENCE_FALLBACK); `onnxruntime`: the model ran whole on onnxruntime"
    )


class TraceItem(BaseModel):
    """One intermediate value of a traced run."""

    name: str = Field(examples=["y"])
    node: str = Field(description="The node that produced it", examples=["tile"])
    op_type: str = Field(examples=["Tile"])
    version: int | None = Field(examples=[13])
    ran_on: Literal["kernel", "reference"]
    dtype: str = Field(examples=["float"])
    shape: list[int] = Field(examples=[[2, 3]])
    microseconds: float = Field(description="Time the node took (all its outputs)")
    value: Tensor


_Y: dict[str, Any] = {"dtype": "float", "shape": [2, 3], "data": [1, 2, 3, 1, 2, 3]}
_SHAPE: dict[str, Any] = {"dtype": "int64", "shape": [2], "data": [2, 3]}


class ModelRunResponse(BaseModel):
    """The outputs of a model run and the nodes that ran."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "outputs": {"y": _Y, "shape": _SHAPE},
        "nodes": [
            {"name": "tile", "op_type": "Tile", "domain": "", "version": 13, "ran_on": "kernel"},
            {"name": "shape", "op_type": "Shape", "domain": "", "version": 21,
             "ran_on": "kernel"},
        ],
    }]})  # fmt: skip

    outputs: dict[str, Tensor]
    nodes: list[NodeRun]
    trace: list[TraceItem] | None = Field(default=None, description="Only when asked")


class TensorInfo(BaseModel):
    """A graph input or output as the model declares it."""

    name: str
    dtype: str | None = Field(description="Element type; null when the model leaves it open")
    shape: list[int | None] | None = Field(description="null for a dynamic dimension; null "
                                           "for an unknown rank")  # fmt: skip
    optional: bool = Field(default=False, description="An input an initializer defaults")


class ModelVersionState(BaseModel):
    """One version of a repository model."""

    version: int
    ready: bool
    reason: str | None = Field(default=None, description="Why it is not ready")
    engine: Literal["onnxruntime", "exact"] | None = Field(
        default=None, description="The engine that runs it (null: not loaded)"
    )
    engine_reason: str | None = Field(
        default=None, description="Why the exact engine runs it, where its configuration "
        "names onnxruntime")  # fmt: skip
    inputs: list[TensorInfo] = Field(default_factory=list)
    outputs: list[TensorInfo] = Field(default_factory=list)


class RepositoryModel(BaseModel):
    name: str
    versions: list[ModelVersionState]
    reason: str | None = Field(default=None, description="Why the model's folder could not "
                               "be read at all (it then has no versions)")  # fmt: skip


class RepositoryIndex(BaseModel):
    """Every repository model with its versions, newest last."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"models": [{
        "name": "tile_shape", "versions": [{"version": 1, "ready": True, "reason": None,
        "inputs": [{"name": "x", "dtype": "float", "shape": [None, 3], "optional": False}],
        "outputs": [{"name": "y", "dtype": "float", "shape": [None, None], "optional": False}]}],
    }]}]})  # fmt: skip

    models: list[RepositoryModel]
