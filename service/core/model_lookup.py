"""Find the V2 model a name and version name: a repository model first, then an operator
version. Refusals use Triton's words ("Request for unknown model: 'x' is not found"), which
clients match on, with our hints after them."""

from functools import lru_cache
from typing import Any

from service.core.ensemble_model import repository_model
from service.core.model import V2Model
from service.core.operator_model import OperatorModel, operator_model
from service.core.repository_model import RepositoryModel
from service.errors import NotFound, ServiceError
from service.operators import registry

UNKNOWN = "Request for unknown model: "


def find_model(name: str, version: str | None, repository: Any | None) -> V2Model:
    """The model `name` at `version`; without a version, its newest ready version (its newest
    when none is ready). A repository model wins over an operator of the same name."""
    shown = name[:100]
    number = _number(name, version)
    if repository is not None and name in repository:
        versions = repository.versions(name)
        if not versions:  # the model's folder could not be read
            raise NotFound(f"{UNKNOWN}'{shown}' has no available versions "
                           f"({repository.error(name)})")  # fmt: skip
        ready = sorted(v for v, entry in versions.items() if entry.ready)
        pinned = number is not None
        if number is None:
            number = max(ready or versions)
        elif number not in versions:
            raise NotFound(f"{UNKNOWN}'{shown}' version {number} is not found; its versions "
                           f"are {', '.join(map(str, versions))}")  # fmt: skip
        return repository_model(versions[number], ready, pinned, repository)
    return _operator(name, number)


def _number(name: str, version: str | None) -> int | None:
    """The version number a version's text names (None: the newest)."""
    if version is None:
        return None
    if not (version.isascii() and version.isdigit() and len(version) <= 9):
        raise NotFound(f"{UNKNOWN}'{name[:100]}' version {version[:20]!r} is not found: "
                       "versions are numbers")  # fmt: skip
    return int(version)


def operator_named(name: str, version: str | None) -> OperatorModel | None:
    """The operator version a name and a version's text name, as find_model finds it when no
    repository model has the name; None when there is none. Found once per pair: the
    operators never change (a small V2 call asks on every request: api/v2_lane.py)."""
    if len(name) > MAX_CACHED_NAME:
        return None  # no operator's name
    return _operator_named(name, version)


@lru_cache(maxsize=512)  # bounded: a client naming new models only evicts old entries
def _operator_named(name: str, version: str | None) -> OperatorModel | None:
    try:
        return _known_operator(name, _number(name, version))
    except ServiceError:  # NotFound: the general path finds it again, and refuses it in words
        return None


def _operator(name: str, number: int | None) -> OperatorModel:
    if len(name) <= MAX_CACHED_NAME:
        return _known_operator(name, number)
    return _find_operator(name, number)


MAX_CACHED_NAME = 128  # longer names are no operator's: looked up (and refused) each time


@lru_cache(maxsize=512)  # bounded; a refusal raises, and is not kept
def _known_operator(name: str, number: int | None) -> OperatorModel:
    return _find_operator(name, number)


def _find_operator(name: str, number: int | None) -> OperatorModel:
    if not registry.is_served(name):
        close = registry.closest("", name)
        hint = f" (did you mean {close}?)" if close else ""
        raise NotFound(f"{UNKNOWN}'{name[:100]}' is not found{hint}")
    try:
        return operator_model(name, number)
    except NotFound:
        versions = ", ".join(str(op.since_version) for op in _versions(name))
        raise NotFound(f"{UNKNOWN}'{name}' version {number} is not found; its versions are "
                       f"{versions}") from None  # fmt: skip


def _versions(name: str) -> list[Any]:
    return next(ops for _, op_type, ops in registry.operators() if op_type == name)


def ready_models(repository: Any | None) -> list[V2Model]:
    """Every ready model version: the operators', then the repository's, by name and version."""
    models: list[V2Model] = [operator_model(op.op_type, op.since_version)
                             for _, _, ops in registry.operators() for op in ops]  # fmt: skip
    for name in repository.names() if repository is not None else []:
        versions = repository.versions(name)  # type: ignore[union-attr]
        ready = sorted(v for v, entry in versions.items() if entry.ready)
        models += [repository_model(versions[v], ready, True, repository) for v in ready]
    return models


def model_versions(model: V2Model, repository: Any | None) -> list[V2Model]:
    """Every version of the model `model` is one version of."""
    if isinstance(model, RepositoryModel) and repository is not None:
        versions = repository.versions(model.name)
        ready = sorted(v for v, entry in versions.items() if entry.ready)
        return [repository_model(entry, ready, True, repository)
                for entry in versions.values()]  # fmt: skip
    return [operator_model(op.op_type, op.since_version) for op in _versions(model.name)]
