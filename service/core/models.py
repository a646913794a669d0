"""Find the V2 model a path names: a repository model first, then an operator version."""

from typing import Any

from service.core.model import V2Model
from service.core.operator_model import operator_model
from service.core.repository_model import RepositoryModel
from service.errors import NotFound


def find_model(name: str, version: str | None, repository: Any | None) -> V2Model:
    """The model `name` at `version` (its newest when None). A repository model wins over an
    operator of the same name; unknown names and versions are NotFound (404)."""
    number = None
    if version is not None:
        if not (version.isascii() and version.isdigit() and len(version) <= 9):
            raise NotFound(f"{name[:100]} has no version {version[:20]!r}: versions are numbers")
        number = int(version)
    if repository is not None and name in repository.names():
        entry = repository.get(name, number)
        return RepositoryModel(entry, sorted(repository.versions(name)))
    return operator_model(name, number)
