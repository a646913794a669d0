"""The catalog's descriptions: what each version changed, as the ONNX changelog states it."""

import pytest

from service.operators.catalog import describe, what_changed
from service.operators.registry import resolve

# Facts from the ONNX operator changelog, written down by hand.
CHANGES = [
    ("Tile", 1, "Tile-1 is the first version."),
    ("Tile", 6, "inputs input, repeats (were input, tiles, axis)"),
    ("Tile", 13, "Changes from Tile-6: new element types bfloat16."),
    ("Shape", 15, "Changes from Shape-13: new attributes end, start."),
    ("Constant", 11, "Changes from Constant-9: new attributes sparse_value."),
    ("ConstantOfShape", 21, "Changes from ConstantOfShape-20: new element types int4, uint4."),
    ("RandomUniformLike", 22, "new element types bfloat16."),
]


@pytest.mark.parametrize(("op_type", "version", "words"), CHANGES)
def test_what_changed(op_type: str, version: int, words: str) -> None:
    assert words in what_changed(resolve(op_type, version))


def test_description_holds_the_summary_and_the_change() -> None:
    text = describe(resolve("Shape", 17)).description
    assert text.startswith("Shape: the dimensions of the input tensor")
    assert text.endswith("Changes from Shape-13: new attributes end, start.")
