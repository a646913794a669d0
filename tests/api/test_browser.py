"""Swagger UI and ReDoc in headless Chromium, against a real server, with the network closed to
everything but the service: the pages render from the service's own assets, Swagger UI opens
with its tags collapsed and Tile first, and an operation's example runs from "Try it out" /
"Execute" to a 200 shown in the page, also with API keys on after "Authorize"."""

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

from .live_server import Server, serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
SCREENSHOTS = "/tmp/opserve-browser"
TIMEOUT_MS = 15_000


@dataclass
class Network:
    """What the page asked of the network besides the service, and what did not load."""

    host: str
    other_hosts: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def route(self, route: Any) -> None:
        if urlsplit(route.request.url).netloc == self.host:
            route.continue_()
        else:  # offline: nothing but the service is reachable
            self.other_hosts.append(route.request.url)
            route.abort()

    def assert_clean(self) -> None:
        assert not self.other_hosts, f"the page tried other hosts: {self.other_hosts}"
        assert not self.failed, f"requests failed: {self.failed}"
        assert not self.errors, f"errors in the page: {self.errors}"


API_KEY = "browser-test-key"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serve(access_log="false") as running:
        yield running


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[Server]:
    with serve(access_log="false", api_keys=API_KEY) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


def _page(browser: Any, server: Server) -> Iterator[tuple[Any, Network]]:
    context = browser.new_context(viewport={"width": 1280, "height": 1400})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    network = Network(host=f"127.0.0.1:{server.port}")
    page.route("**/*", network.route)
    page.on("requestfailed", lambda r: network.failed.append(f"{r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and network.failed.append(f"{r.url} {r.status}"))
    page.on("pageerror", lambda error: network.errors.append(str(error)))
    yield page, network
    context.close()


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[tuple[Any, Network]]:
    yield from _page(browser, server)


@pytest.fixture
def keyed_page(browser: Any, keyed_server: Server) -> Iterator[tuple[Any, Network]]:
    yield from _page(browser, keyed_server)


def test_swagger_ui_renders_offline_collapsed_with_tile_first(
    page: tuple[Any, Network], server: Server
) -> None:
    tab, network = page
    tab.goto(f"{server.url}/docs")
    tab.wait_for_selector(".swagger-ui .info .title")
    assert "opserve" in tab.inner_text(".swagger-ui .info .title")
    tags = tab.locator(".opblock-tag-section h3").all_inner_texts()
    assert tags[0].split()[0] == "Tile" and len(tags) == 11, tags
    for operator in ("Constant", "ConstantOfShape", "RandomUniformLike", "Tile", "Shape"):
        assert tab.locator(f"#operations-tag-{operator}").count() == 1
    tab.screenshot(path=f"{SCREENSHOTS}-swagger-first-screen.png")
    assert tab.locator(".opblock").count() == 0  # every tag collapsed: no operation shown
    tab.locator("#operations-tag-Tile").click()  # one tag opens with its operations folded
    tab.locator("#operations-Tile-run_Tile_13").wait_for()
    assert tab.locator(".opblock").count() == 6 and tab.locator(".opblock.is-open").count() == 0
    network.assert_clean()


def _execute_tile13(tab: Any) -> dict[str, Any]:
    """Open Tile, then Tile-13, Try it out with its example, Execute; the answer shown."""
    tab.locator("#operations-tag-Tile").click()
    operation = tab.locator("#operations-Tile-run_Tile_13")
    operation.locator(".opblock-summary").click()
    operation.locator(".try-out__btn").click()
    example = json.loads(operation.locator("textarea.body-param__text").input_value())
    assert set(example["inputs"]) == {"input", "repeats"}  # pre-filled from the schema example
    operation.locator(".btn.execute").click()
    live = operation.locator(".live-responses-table .response")
    live.first.wait_for(timeout=5000)
    operation.scroll_into_view_if_needed()
    status = live.first.locator(".response-col_status").inner_text().strip()
    body = live.first.locator(".response-col_description pre").first.inner_text()
    return {"status": status, "body": json.loads(body), "operation": operation}


def test_swagger_try_it_out_executes_the_example(page: tuple[Any, Network], server: Server) -> None:
    tab, network = page
    tab.goto(f"{server.url}/docs")
    shown = _execute_tile13(tab)
    shown["operation"].screenshot(path=f"{SCREENSHOTS}-swagger-tile13.png")
    assert shown["status"] == "200"
    body = shown["body"]
    assert body["op_type"] == "Tile" and body["version"] == 13
    assert body["outputs"]["output"]["shape"] == [4, 6]
    network.assert_clean()


def test_with_api_keys_authorize_then_try_it_out(
    keyed_page: tuple[Any, Network], keyed_server: Server
) -> None:
    tab, network = keyed_page
    tab.goto(f"{keyed_server.url}/docs")  # the page itself needs no key
    tab.locator(".btn.authorize").first.click()
    dialog = tab.locator(".modal-ux")
    dialog.locator("input").first.fill(API_KEY)
    dialog.locator(".auth-btn-wrapper .authorize").click()
    tab.screenshot(path=f"{SCREENSHOTS}-swagger-authorized.png")
    dialog.locator(".btn-done").click()
    shown = _execute_tile13(tab)
    assert shown["status"] == "200" and shown["body"]["outputs"]["output"]["shape"] == [4, 6]
    assert "Authorization: Bearer browser-test-key" in shown["operation"].inner_text()  # the curl
    network.assert_clean()


def test_redoc_renders_offline(page: tuple[Any, Network], server: Server) -> None:
    tab, network = page
    tab.goto(f"{server.url}/redoc")
    heading = tab.locator("h2", has_text="Run Tile-13")
    heading.wait_for()
    heading.scroll_into_view_if_needed()
    tab.screenshot(path=f"{SCREENSHOTS}-redoc.png")
    assert tab.locator("h2", has_text="Run Shape-15").count() == 1
    assert "opserve" in tab.locator("h1").first.inner_text()
    network.assert_clean()
