"""The response cache's local store (core/response_cache.py): least recently used entries go
first past its size, every entry is kept in the memory budget and given back when dropped, an
entry the budget cannot take now is not kept, and entries expire; the key's parts each count.
Also the Redis entry's form (cluster/response_cache.py) read back as written."""

import asyncio
import time

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper

from service.cluster.response_cache import pack, unpack
from service.codecs.limits import Limits
from service.core.memory_budget import MemoryBudget
from service.core.response_cache import ENTRY_OVERHEAD, LocalStore, arrays_nbytes
from service.runtime.cache_tag import cache_tag
from service.runtime.config.messages import ModelConfig

MiB = 1 << 20


def _entry(i: int) -> dict[str, np.ndarray]:
    return {"Y": np.full(250, i, np.float32)}  # 1000 bytes


def test_lru_within_its_size_and_the_budget() -> None:
    budget = MemoryBudget(16 * MiB, 0)
    size = arrays_nbytes(_entry(0))
    assert size == 1000 + ENTRY_OVERHEAD
    store = LocalStore(3 * size, 60, budget)

    async def go() -> None:
        for i in range(3):
            await store.put(bytes([i]), _entry(i), size)
        assert (budget.used, budget.kept) == (3 * size, 3 * size)
        assert await store.get(bytes([0])) is not None  # 0 is now the most recent
        await store.put(bytes([3]), _entry(3), size)  # drops 1, the least recently used
        assert await store.get(bytes([1])) is None
        found = await store.get(bytes([0]))
        assert found is not None and found["Y"][0] == 0
        assert budget.used == 3 * size and store.used == 3 * size
        store.clear()
        assert budget.used == budget.kept == 0

    asyncio.run(go())


def test_the_budget_comes_first_and_entries_expire() -> None:
    budget = MemoryBudget(16 * MiB, 0)
    store = LocalStore(MiB, 0.5, budget)  # half a second: a busy host's pause stays within
    size = arrays_nbytes(_entry(0))

    async def go() -> None:
        assert budget.try_take(16 * MiB - size + 1)  # a request holds nearly all of it
        await store.put(b"a", _entry(1), size)
        assert await store.get(b"a") is None and budget.kept == 0
        budget.release(16 * MiB - size + 1)
        await store.put(b"a", _entry(1), size)
        assert await store.get(b"a") is not None
        time.sleep(0.6)
        assert await store.get(b"a") is None and budget.used == 0

    asyncio.run(go())


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.array([[True, False]]),
    np.array(["ab", "", "ü"], dtype=object),
])  # fmt: skip
def test_redis_entries_read_back(array: np.ndarray) -> None:
    back = unpack(pack({"Y": array, "Z": array[:1]}), Limits(1 << 20, 1 << 20, 64))
    assert list(back) == ["Y", "Z"]
    np.testing.assert_array_equal(back["Y"], array)
    assert back["Y"].dtype == array.dtype and back["Z"].shape == array[:1].shape
    with pytest.raises(ValueError, match="after"):
        unpack(pack({"Y": array}) + b"x", Limits(1 << 20, 1 << 20, 64))


def _config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def test_random_operators_are_never_cached() -> None:
    config = _config("response_cache { enable: true }")
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])

    def model(op: str) -> bytes:
        graph = helper.make_graph([helper.make_node(op, ["X"], ["Y"])], "g", [x], [y])
        return helper.make_model(graph).SerializeToString()

    assert cache_tag(model("Relu"), config) is not None
    assert cache_tag(model("Relu"), _config("")) is None  # no switch
    assert cache_tag(model("RandomNormalLike"), config) is None
    assert cache_tag(model("Relu"), config) != cache_tag(model("Neg"), config)
