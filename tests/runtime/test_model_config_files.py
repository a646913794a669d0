"""config.pbtxt, model file names and label files read as untrusted input: only regular files,
bounded, never blocking on a FIFO, never reading outside the model directory."""

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from service.errors import InvalidInput
from service.runtime.config import files as config_files
from service.runtime.config.files import (
    check_label_files,
    model_file,
    output_labels,
    read_config,
    read_labels,
    read_regular,
)

from .config_models import DENSENET_PBTXT, SIMPLE_PBTXT, pbtxt


def _model_dir(tmp_path: Path, text: str | bytes | None = None) -> Path:
    folder = tmp_path / "m"
    folder.mkdir()
    if text is not None:
        data = text.encode() if isinstance(text, str) else text
        (folder / "config.pbtxt").write_bytes(data)
    return folder


def test_a_good_config_is_parsed(tmp_path: Path) -> None:
    config = read_config(_model_dir(tmp_path, SIMPLE_PBTXT))
    assert config is not None
    assert (config.name, config.max_batch_size) == ("simple", 8)
    assert [io.name for io in config.input] == ["INPUT0", "INPUT1"]
    assert list(config.input[0].dims) == [16]


def test_no_config_is_none(tmp_path: Path) -> None:
    assert read_config(_model_dir(tmp_path)) is None
    assert read_config(tmp_path / "no-such-model") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "m"\nmax_batch_size: 8\n  foo: 3',
         'config.pbtxt is not a text-format ModelConfig: 3:3 : Message type '
         '"inference.ModelConfig" has no field named "foo".'),
        ("max_batch_size: eight",
         "config.pbtxt is not a text-format ModelConfig: 1:17 : 'max_batch_size: eight': "
         "Couldn't parse integer: eight"),
        ("max_batch_size: 1 max_batch_size: 2",
         'config.pbtxt is not a text-format ModelConfig: 1:35 : Message type '
         '"inference.ModelConfig" should not have multiple "max_batch_size" fields.'),
        (b'name: "\xff"', "config.pbtxt is not UTF-8 text (byte 7)"),
        ("input [ { name: " + "x" * 5000, "config.pbtxt is not a text-format ModelConfig: "),
    ],
)  # fmt: skip
def test_a_malformed_config_is_refused(tmp_path: Path, text: str | bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        read_config(_model_dir(tmp_path, text))
    assert str(caught.value).startswith(message)
    assert len(str(caught.value)) < 400  # the parser's words are cut short


def test_an_oversized_config_is_refused_before_reading(tmp_path: Path) -> None:
    folder = _model_dir(tmp_path, SIMPLE_PBTXT + " " * 100)
    size = (folder / "config.pbtxt").stat().st_size
    with pytest.raises(
        InvalidInput, match=rf"^config.pbtxt has {size} bytes, over the limit of 64$"
    ):
        read_config(folder, max_bytes=64)
    assert read_config(folder, max_bytes=size) is not None


def _returns_promptly(call: Any) -> BaseException | None:
    """Run `call` on a daemon thread; it must finish within 5 s (a FIFO read would block)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # handed back to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "the call blocked"
    return outcome[0]


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    folder = _model_dir(tmp_path)
    os.mkfifo(folder / "config.pbtxt")
    error = _returns_promptly(lambda: read_config(folder))
    assert isinstance(error, InvalidInput)
    assert str(error) == "config.pbtxt is a FIFO; only a regular file is read"


def test_a_fifo_swapped_in_after_lstat_is_refused_after_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """O_NONBLOCK keeps the open from waiting for a writer; fstat then refuses it."""
    folder = _model_dir(tmp_path)
    os.mkfifo(folder / "config.pbtxt")
    regular = os.stat_result((stat.S_IFREG | 0o644, *[0] * 9))
    monkeypatch.setattr(config_files.os, "lstat", lambda path: regular)
    error = _returns_promptly(lambda: read_config(folder))
    assert str(error) == "config.pbtxt is a FIFO; only a regular file is read"


def test_a_symlink_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _model_dir(tmp_path)
    (tmp_path / "elsewhere.pbtxt").write_text(SIMPLE_PBTXT)
    (folder / "config.pbtxt").symlink_to(tmp_path / "elsewhere.pbtxt")
    refusal = "^config.pbtxt is a symbolic link; only a regular file is read$"
    with pytest.raises(InvalidInput, match=refusal):
        read_config(folder)
    regular = os.stat_result((stat.S_IFREG | 0o644, *[0] * 9))
    monkeypatch.setattr(config_files.os, "lstat", lambda path: regular)  # O_NOFOLLOW's turn
    with pytest.raises(InvalidInput, match=refusal):
        read_config(folder)


@pytest.mark.parametrize(
    ("make", "kind"),
    [(lambda p: p.mkdir(), "a directory"), (lambda p: None, None)],
)
def test_other_kinds_of_file(tmp_path: Path, make: Any, kind: str | None) -> None:
    path = tmp_path / "thing"
    make(path)
    if kind is None:
        assert read_regular(path, "thing", 10) is None
        return
    with pytest.raises(InvalidInput, match=f"^thing is {kind}; only a regular file is read$"):
        read_regular(path, "thing", 10)


def test_a_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"^null is a character device; only a regular"):
        read_regular(Path("/dev/null"), "null", 10)


@pytest.mark.parametrize(
    ("filename", "refused"),
    [("", False), ("model.onnx", False), ("sub/model.onnx", False), ("./model.onnx", False),
     ("../model.onnx", True), ("sub/../../model.onnx", True), ("/tmp/model.onnx", True),
     ("model\0.onnx", True)],
)  # fmt: skip
def test_model_file_names(filename: str, refused: bool) -> None:
    config = pbtxt(SIMPLE_PBTXT)
    config.default_model_filename = filename
    if not refused:
        assert model_file(config) == (filename or "model.onnx")
        return
    with pytest.raises(InvalidInput) as caught:
        model_file(config)
    assert str(caught.value) == (
        f"default_model_filename '{filename}' for model 'simple' must be a relative path "
        "inside the version directory (not absolute, no '..' part, no NUL)"
    )


@pytest.fixture
def densenet_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "repo" / "densenet_onnx"
    (folder / "sub").mkdir(parents=True)
    (folder / "densenet_labels.txt").write_bytes(b"TENCH\r\nGOLDFISH\r\n\r\nVULTURE\n")
    (folder / "sub" / "labels.txt").write_text("A\nB")
    (folder / "inner_link.txt").symlink_to(folder / "sub" / "labels.txt")
    (tmp_path / "secret.txt").write_text("SECRET\n")
    (folder / "escape.txt").symlink_to(tmp_path / "secret.txt")
    return folder


def test_labels_are_read_one_per_line(densenet_dir: Path) -> None:
    labels = read_labels(densenet_dir, "densenet_labels.txt", 1000)
    assert labels == ["TENCH", "GOLDFISH", "", "VULTURE"]  # "\r" stripped, the empty one kept
    assert read_labels(densenet_dir, "sub/labels.txt", 1000) == ["A", "B"]
    assert read_labels(densenet_dir, "inner_link.txt", 1000) == ["A", "B"]  # a link inside
    config = pbtxt(DENSENET_PBTXT)
    assert output_labels(densenet_dir, config, 1000) == {"fc6_1": labels}
    check_label_files(config, densenet_dir)


@pytest.mark.parametrize("filename", ["../../etc/passwd", "/etc/passwd", "escape.txt",
                                      "../secret.txt", "sub/../../secret.txt", "a\0b"])  # fmt: skip
def test_a_label_file_outside_the_model_directory_is_refused(
    densenet_dir: Path, filename: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(
        os, "open", lambda path, *a: opened.append(str(path)) or real_open(path, *a)
    )
    config = pbtxt(DENSENET_PBTXT)
    config.output[0].label_filename = filename
    with pytest.raises(InvalidInput) as caught:
        check_label_files(config, densenet_dir)
    assert str(caught.value) == (
        f"label file path '{filename}' for output 'fc6_1' in model 'densenet_onnx' is outside "
        "model directory"
    )
    with pytest.raises(InvalidInput, match=r"is outside model directory$"):
        read_labels(densenet_dir, filename, 1000)
    with pytest.raises(InvalidInput, match=r"is outside model directory$"):
        output_labels(densenet_dir, config, 1000)
    assert opened == []  # refused before anything was opened


def test_label_files_missing_or_too_big(densenet_dir: Path) -> None:
    with pytest.raises(
        InvalidInput, match=r"^label file .nope\.txt. is not in the model directory$"
    ):
        read_labels(densenet_dir, "nope.txt", 1000)
    with pytest.raises(InvalidInput, match=r"over the limit of 5$"):
        read_labels(densenet_dir, "densenet_labels.txt", 5)
