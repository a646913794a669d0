"""Fixtures of the HTTP tests: the app in-process, behind Starlette's TestClient."""

import warnings
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from service.main import create_app
from service.settings import Settings

with warnings.catch_warnings():
    # Starlette 1.x nags about httpx; the TestClient itself works unchanged.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return create_app(Settings())


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    """In-process client; server errors come back as 500 responses, never as exceptions."""
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client
