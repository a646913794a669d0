"""The neutral inference call and its result: what every front door converts its wire format to
(V2 JSON and binary over HTTP, gRPC messages) and back. Plain data, no behaviour."""

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from api_schemas.v2 import Parameters

AnswerForm = Literal["v2_json", "v2_binary"]
"""How the door will encode the outputs: as JSON text (bounded as such) or as raw bytes."""


@dataclass(slots=True)
class InferInput:
    """One input tensor as sent: its elements as JSON `data`, or as `raw` bytes in the binary
    tensor layout (Triton's binary extension, gRPC's raw contents), or in a shared memory region
    named by its parameters. Decoded by the core (dataplane.py), once, after the model is known
    to be ready."""

    name: str
    datatype: str
    shape: list[int]
    parameters: Parameters = field(default_factory=dict)
    data: Any = None
    raw: memoryview | bytes | None = None


@dataclass(slots=True)
class RequestedOutput:
    """An output asked for by name, with its parameters as sent (classification, a shared
    memory region, the door's own), and whether the door answers it as raw bytes."""

    name: str
    parameters: Parameters = field(default_factory=dict)
    binary: bool = False


@dataclass(slots=True)
class InferCall:
    """One inference request, whatever door it came through."""

    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None = None  # None: every output of the model
    parameters: Parameters = field(default_factory=dict)
    id: str | None = None
    answer_form: AnswerForm = "v2_json"


@dataclass(slots=True)
class OutputTensor:
    """One output of a result: its array, or None when it was written to shared memory (its
    parameters then say where)."""

    name: str
    datatype: str
    shape: list[int]
    array: np.ndarray | None
    parameters: Parameters = field(default_factory=dict)  # what the door answers with it


@dataclass(slots=True)
class InferResult:
    """The outputs of one inference, in the order asked for (the model's order by default)."""

    model_name: str
    model_version: str
    id: str | None
    outputs: list[OutputTensor]
    parameters: Parameters = field(default_factory=dict)
