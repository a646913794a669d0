"""A load request's checks (runtime/load_request.py), the ones both doors share: names no
folder could have, file paths, the caps on files and their bytes, the config's size, base64
left undecoded until the load reads it, and the memory the load is held to."""

import base64

import pytest

from service.errors import BadRequest, PayloadTooLarge, PollFailed, ServiceError
from service.runtime.config.files import MAX_CONFIG_BYTES
from service.runtime.load_request import NAME_MAX, Base64, load_request
from service.runtime.plan import LOAD_MEMORY_FACTOR
from service.settings import Settings

SETTINGS = Settings(max_load_files=5, max_model_bytes=4096)


@pytest.mark.parametrize(("name", "words"), [
    ("", "Model name cannot be empty"),
    ("   ", "Model name cannot be empty"),
    ("..", "must not contain path traversal characters"),
    ("a/b", "must not contain path traversal characters"),
    ("dense\0net", "a NUL byte is in no file name"),
    ("\0", "a NUL byte"),
    ("x\udcff", "not UTF-8"),
    ("é" * 128, f"over {NAME_MAX} bytes"),  # 256 bytes in 128 characters
    ("b" * (NAME_MAX + 1), f"over {NAME_MAX} bytes"),
])  # fmt: skip
def test_names_no_folder_could_have_are_refused(name: str, words: str) -> None:
    with pytest.raises(BadRequest, match=words) as refused:
        load_request(name, None, {}, SETTINGS)
    assert type(refused.value) is BadRequest and len(str(refused.value)) < 300


@pytest.mark.parametrize("name", ["simple", "a" * NAME_MAX, "é" * 127, "名前", ".x", "a b"])
def test_names_a_folder_may_have_pass(name: str) -> None:
    assert load_request(name, None, {}, SETTINGS).name == name


@pytest.mark.parametrize("path", ["Z" * (NAME_MAX + 1), "1/" + "y" * 300, "é" * 200 + "/m",
                                  "../" + "q" * 256])  # fmt: skip
def test_a_path_component_over_name_max_is_tritons_poll_failure(path: str) -> None:
    with pytest.raises(PollFailed) as refused:
        load_request("simple", "{}", {path: b"a"}, SETTINGS)
    assert str(refused.value).startswith("failed to load 'simple', failed to poll from model "
                                         "repository: ")  # fmt: skip


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../1/model.onnx", "1/../../x", "1//m",
                                  "1/./model.onnx", "1/model.onnx\0", "./1", "1/", "x\udcff"])  # fmt: skip
def test_paths_that_leave_or_break_are_refused(path: str) -> None:
    with pytest.raises(BadRequest, match="must be a relative path") as refused:
        load_request("simple", "{}", {path: b"a"}, SETTINGS)
    assert not isinstance(refused.value, PollFailed)


def test_the_caps_hold_before_anything_is_decoded() -> None:
    six = {f"{n}/model.onnx": b"x" for n in range(1, 7)}
    with pytest.raises(BadRequest, match=r"has 6 file parameters, over the limit of 5 "
                       r"\(OPSERVE_MAX_LOAD_FILES\)"):  # fmt: skip
        load_request("m", "{}", six, SETTINGS)
    heavy = {"1/model.onnx": b"x" * 3000, "2/model.onnx": Base64("file:2", "QUFB" * 400)}
    with pytest.raises(PayloadTooLarge, match=r"hold 4200 bytes, over the limit of 4096 "
                       r"\(OPSERVE_MAX_MODEL_BYTES\)"):  # fmt: skip
        load_request("m", "{}", heavy, SETTINGS)
    with pytest.raises(PayloadTooLarge, match="load parameter 'config' is over"):
        load_request("m", " " * (MAX_CONFIG_BYTES + 1), {}, SETTINGS)
    with pytest.raises(PayloadTooLarge, match="load parameter 'config' is over"):
        load_request("m", "é" * (MAX_CONFIG_BYTES // 2 + 1), {}, SETTINGS)  # bytes, not chars
    with pytest.raises(BadRequest, match="need a 'config' too"):
        load_request("m", None, {"1/model.onnx": b"x"}, SETTINGS)


def test_base64_is_checked_cheaply_then_decoded_by_the_load() -> None:
    for text in ("not base64!", "QUFBé===", "QUF"):
        with pytest.raises(BadRequest, match="load parameter 'file:1/m' is not base64"):
            Base64("file:1/m", text)
    sent = Base64("file:1/m", "QUF*")  # shaped like base64, decoded only by the load
    request = load_request("m", "{}", {"1/m": sent}, SETTINGS)
    with pytest.raises(BadRequest, match="is not base64"):
        request.overrides.file_bytes("1/m")
    data = bytes(range(256)) * 3
    request = load_request("m", "{}", {"1/m": Base64("k", base64.b64encode(data).decode())},
                           SETTINGS)  # fmt: skip
    assert request.overrides.file_bytes("1/m") == data


def test_the_memory_a_load_holds_counts_its_files_config_and_loading() -> None:
    files = {"1/m": b"x" * 1000, "2/m": Base64("k", "QUFB" * 100)}  # 1000 + 300 bytes
    request = load_request("m", '{"max_batch_size": 8}', files, SETTINGS)
    assert request.memory >= (1 + LOAD_MEMORY_FACTOR) * 1300 + len('{"max_batch_size": 8}')
    assert load_request("m", None, {}, SETTINGS).memory == 0


def test_the_settings_bound_both_caps() -> None:
    for field in ("max_load_files", "max_load_versions"):
        with pytest.raises(ValueError):
            Settings(**{field: 0})
        assert 0 < getattr(Settings(), field) <= 1000
    assert issubclass(PollFailed, ServiceError) and PollFailed("x").status_code == 400
