"""Triton's model warmup: a version's `model_warmup` samples run before it turns READY, and a
sample that fails fails the load with its reason (Triton's "failed to run warmup sample").

A sample gives each input its `data_type`, `dims` (no batch dim) and data: `zero_data`,
`random_data` (random bytes; BYTES get empty strings, as Triton's) or `input_data_file`, a file
of the model's `warmup/` folder holding the raw bytes in row-major order (BYTES: Triton's
4-byte little-endian length before each element). As Triton builds it, each run takes
`batch_size` rows of the one sample: a model with max_batch_size > 0 gets them as its batch
dimension in one run, a model without batching runs the sample `batch_size` times; `count`
runs (0: one); a sample of batch_size 0 is skipped. An input that is no config input but a
graph input (a sequence's control) is fed as it is.

Bounded as requests are: each input's elements (OPSERVE_MAX_ELEMENTS) and strings
(OPSERVE_MAX_STRING_BYTES) before it is made; its bytes and the run's claimed from the
memory budget; a file read only as a regular file inside `warmup/` (never through a link
out of it), only the bytes the sample needs; the runs asked for (OPSERVE_MAX_WARMUP_RUNS),
each run (OPSERVE_MAX_RUN_SECONDS) and the whole warmup (OPSERVE_MAX_WARMUP_SECONDS). Runs go
where the model's requests go: a client's model to the isolated workers. A model sent whole
has no folder, so no files. Runs on the repository's loader thread; no statistics count
warmup (Triton's count none either).
"""

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.codecs.limits import Limits
from service.codecs.v2_binary import decode_binary
from service.errors import InvalidInput, PayloadTooLarge, RunTimeout, ServiceError
from service.kernels.context import KernelContext
from service.runtime.config.files import inside, read_regular
from service.runtime.config.messages import element_of, shown
from service.runtime.config.request_io import RequestIO
from service.runtime.graph import LoadedModel
from service.runtime.run_control import RunControl
from service.settings import Settings

WARMUP_FOLDER = "warmup"  # Triton's kWarmupDataFolder
_POLL_SECONDS = 0.005  # how often a claim short of the budget looks again


@dataclass(frozen=True)
class WarmupRuns:
    """What warmup runs use: the server's memory budget (core/memory_budget.MemoryBudget) and
    its isolated workers' pool (engines/workers/pool.FallbackPool); None: none (unbudgeted;
    a client's model then cannot warm up, as it cannot run)."""

    budget: Any = None
    fallback: Any = None


UNBUDGETED = WarmupRuns()


def warm_up(config: Any, model: LoadedModel, io: RequestIO, folder: Path | None,
            settings: Settings, runs: WarmupRuns) -> None:  # fmt: skip
    """Run every warmup sample of the completed `config` on `model`; InvalidInput with the
    reason of the first that cannot be made or fails (the load then fails with it)."""
    samples = [sample for sample in config.model_warmup if sample.batch_size > 0]
    if not samples:
        return
    batching = config.max_batch_size > 0
    asked = sum(max(s.count, 1) * (1 if batching else s.batch_size) for s in samples)
    if asked > settings.max_warmup_runs:
        raise InvalidInput(f"model_warmup asks for {asked} runs, over the limit of "
                           f"{settings.max_warmup_runs} (OPSERVE_MAX_WARMUP_RUNS)")  # fmt: skip
    deadline = time.monotonic() + settings.max_warmup_seconds
    limits = Limits(settings.max_elements, settings.max_string_bytes)
    for sample in samples:
        claims = _Claims(runs.budget)
        try:
            try:
                feeds = _feeds(sample, model, io, folder, limits, claims, batching)
            except ServiceError as exc:
                raise InvalidInput(f"warmup sample '{shown(sample.name)}': {exc}") from None
            for _ in range(max(sample.count, 1) * (1 if batching else sample.batch_size)):
                _run(sample.name, model, feeds, settings, runs, deadline, claims)
        finally:
            claims.release()


def _feeds(sample: Any, model: LoadedModel, io: RequestIO, folder: Path | None, limits: Limits,
           claims: "_Claims", batching: bool) -> dict[str, np.ndarray]:  # fmt: skip
    """The sample's inputs, checked against the config as a request's are (Triton's texts) and
    shaped for the graph; a graph input the config does not name (a control) as it is."""
    rows = sample.batch_size if batching else 0
    arrays = {name: _input(name, sample.inputs[name], rows, folder, limits, claims)
              for name in sorted(sample.inputs)}  # fmt: skip
    graph = {spec.name for spec in model.inputs}
    controls = {n: a for n, a in arrays.items() if n not in io.inputs and n in graph}
    feeds = io.graph_inputs({n: a for n, a in arrays.items() if n not in controls})
    return {**feeds, **controls}


def _input(name: str, spec: Any, rows: int, folder: Path | None, limits: Limits,
           claims: "_Claims") -> np.ndarray:  # fmt: skip
    """One input of `rows` rows (0: no batch dim) of the sample's data, sized before made."""
    element = element_of(spec.data_type)
    if element is None:
        raise InvalidInput(f"warmup setting expects input '{shown(name)}' to have a data_type")
    dims = [int(d) for d in spec.dims]
    if any(d < 0 for d in dims):
        raise InvalidInput("warmup setting expects all variable-size dimensions are specified "
                           f"for input '{shown(name)}'")  # fmt: skip
    try:
        count = limits.check_shape(dims)
        limits.check_shape([rows, *dims] if rows else dims)
    except PayloadTooLarge as exc:
        raise PayloadTooLarge(f"input '{shown(name)}': {exc} (OPSERVE_MAX_ELEMENTS)") from None
    kind = spec.WhichOneof("input_data_type")
    nbytes = 4 * count if element.is_string else element.raw_nbytes(count)
    claims.claim(2 * nbytes * max(rows, 1))  # the row's bytes and the input made of them
    if kind == "zero_data" or (kind == "random_data" and element.is_string):
        raw = bytes(nbytes)
    elif kind == "random_data":
        raw = np.random.default_rng().bytes(nbytes)
    elif kind == "input_data_file":
        raw = _file(folder, spec.input_data_file, name, nbytes, element.is_string, limits)
        if element.is_string:  # decoding makes an object a string, and keeps the text
            claims.claim((57 * count + len(raw)) * max(rows, 1))
    else:
        raise InvalidInput(f"warmup setting expects input '{shown(name)}' to have "
                           "input_data_type set")  # fmt: skip
    row = decode_binary(element, dims, memoryview(raw), limits)
    return np.repeat(row[np.newaxis], rows, axis=0) if rows else row


def _file(folder: Path | None, file_name: str, name: str, nbytes: int, strings: bool,
          limits: Limits) -> bytes:  # fmt: skip
    """The bytes of warmup data file `file_name`: the first `nbytes` (Triton's error when it
    has fewer), or, for strings, the whole file (at most its prefixes and the strings bound)."""
    what = f"warmup data file '{shown(file_name)}' for input '{shown(name)}'"
    if folder is None:
        raise InvalidInput(f"{what}: a model sent whole with a load request has no folder, "
                           "so no warmup files; use zero_data or random_data")  # fmt: skip
    warmup = inside(folder, WARMUP_FOLDER)
    path = inside(warmup, file_name) if warmup is not None else None
    if path is None:
        raise InvalidInput(f"{what} is outside the model's {WARMUP_FOLDER} folder (a path "
                           "out of it, or a link that leaves it); refused")  # fmt: skip
    if strings:
        most = nbytes + limits.max_string_bytes
        data = read_regular(path, what, most, "OPSERVE_MAX_STRING_BYTES")
    else:
        data = read_regular(path, what, nbytes, whole=False)
    if data is None:
        raise InvalidInput(f"{what} is not in the model's {WARMUP_FOLDER} folder")
    if not strings and len(data) < nbytes:
        raise InvalidInput(f"warmup setting expects {nbytes} bytes, but the data provided "
                           f"from {shown(file_name)} only has {len(data)} bytes")  # fmt: skip
    return data


def _run(sample: str, model: LoadedModel, feeds: Mapping[str, np.ndarray], settings: Settings,
         runs: WarmupRuns, deadline: float, claims: "_Claims") -> None:  # fmt: skip
    """One run of a sample, held to the run's deadline and what is left of the warmup's; its
    outputs are dropped (their claims with them)."""
    left = deadline - time.monotonic()
    whole = f"the model's warmup took longer than {settings.max_warmup_seconds:g} s " + (
        "(OPSERVE_MAX_WARMUP_SECONDS)")  # fmt: skip
    if left <= 0:
        raise InvalidInput(f"{whole}; stopped before sample '{shown(sample)}'")
    seconds = min(settings.max_run_seconds, left)
    ctx = KernelContext(settings.max_output_bytes, None, output_format=None, claims=claims,
                        control=RunControl(seconds, runs.fallback))  # fmt: skip
    base = claims.claimed
    try:
        model.run(feeds, ctx=ctx)
    except RunTimeout as exc:
        why = f"{whole}, in sample '{shown(sample)}'" if seconds < settings.max_run_seconds else (
            str(exc))  # fmt: skip
        raise InvalidInput(f"failed to run warmup sample '{shown(sample)}': {why}; ") from None
    except ServiceError as exc:  # Triton's text, its trailing "; " too
        raise InvalidInput(f"failed to run warmup sample '{shown(sample)}': {exc}; ") from None
    finally:
        claims.claimed = base


class _Claims:
    """A warmup's share of the memory budget, claimed on the loader thread: what is short is
    waited for (up to the budget's OPSERVE_MEMORY_WAIT_SECONDS), then the load fails with the
    budget's 503 text; all of it is given back after each sample."""

    def __init__(self, budget: Any) -> None:
        self.budget = budget
        self.held = 0
        self.claimed = 0

    def claim(self, nbytes: int) -> None:
        if self.budget is None:
            return
        self.budget.check_fits(self.claimed + nbytes)
        short = self.claimed + nbytes - self.held
        if short > 0:
            waited_until = time.monotonic() + self.budget.wait_seconds
            while not self.budget.try_take(short):
                if time.monotonic() >= waited_until:
                    raise self.budget.overloaded(short)
                time.sleep(_POLL_SECONDS)
            self.held += short
        self.claimed += nbytes

    def unclaim(self, nbytes: int) -> None:
        self.claimed -= min(nbytes, self.claimed)

    def release(self) -> None:
        if self.held:
            self.budget.release(self.held)
            self.held = 0
