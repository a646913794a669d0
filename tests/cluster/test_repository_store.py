"""The repository's desired state and file blobs against a real Redis, without replicas:
concurrent writes from two processes' stores all hold, each with its own generation; a blob
named by two models lives until neither names it; what a replica fetches is bounded before it
is read and checked against its digest (the store's contents are not trusted blindly)."""

import asyncio
import hashlib

import pytest

from service.cluster.blobs import Blobs
from service.cluster.desired_state import DesiredState, Spec
from service.cluster.store import ClusterStore
from service.core.memory_budget import MemoryBudget, Reservation
from service.errors import BadRequest, PayloadTooLarge
from service.settings import Settings
from tests.cluster.redis_server import RedisServer


def _held(total: int = 1 << 30) -> Reservation:
    """An empty reservation from a budget of `total` bytes."""
    return Reservation(MemoryBudget(total, 0.5))


def _pair(url: str) -> tuple[ClusterStore, ClusterStore]:
    return ClusterStore(url, "test", 1.0), ClusterStore(url, "test", 1.0)


def test_concurrent_writes_from_two_stores_all_hold(redis: RedisServer) -> None:
    async def scenario() -> None:
        first, second = _pair(redis.url)
        states = [DesiredState(first), DesiredState(second)]
        await states[0].seed({"kept": Spec()})
        epoch = (await states[0].read()).epoch  # type: ignore[union-attr]
        writes = [states[i % 2].write(epoch, f"model{i}", Spec(config=f'{{"n": {i}}}'))
                  for i in range(20)]  # fmt: skip
        generations = await asyncio.gather(*writes)
        assert sorted(generations) == list(range(2, 22))  # each its own, none lost
        snapshot = await states[1].read()
        assert snapshot is not None and snapshot.generation == 21
        assert set(snapshot.models) == {"kept", *(f"model{i}" for i in range(20))}
        assert snapshot.models["model7"].config == '{"n": 7}'
        await states[1].seed({})  # a record exists: seeding again changes nothing
        assert (await states[0].version()) == (epoch, 21)
        await first.close()
        await second.close()

    asyncio.run(scenario())


def test_a_blob_lives_while_a_model_names_it(redis: RedisServer) -> None:
    async def scenario() -> None:
        store = ClusterStore(redis.url, "test", 1.0)
        state = DesiredState(store)
        blobs = Blobs(store, state.blob_prefix, Settings())
        await state.seed({})
        epoch = (await state.read()).epoch  # type: ignore[union-attr]
        digest = await blobs.put(b"weights")
        assert await blobs.put(b"weights") == digest == hashlib.sha256(b"weights").hexdigest()
        assert await store.redis.pttl(state.blob_prefix + digest) > 0  # nobody's yet: expires
        for name in ("a", "b"):
            await state.write(epoch, name, Spec("{}", {"1/model.onnx": digest}))
        assert await store.redis.pttl(state.blob_prefix + digest) == -1  # named: kept
        await state.write(epoch, "a", None)
        fetched = await blobs.fetch("b", {"1/model.onnx": digest}, _held())
        assert fetched == {"1/model.onnx": b"weights"}
        await state.write(epoch, "b", Spec("{}"))  # loaded again without the file
        assert not await store.redis.exists(state.blob_prefix + digest)
        await store.close()

    asyncio.run(scenario())


def test_fetching_is_bounded_and_checked(redis: RedisServer) -> None:
    async def scenario() -> None:
        store = ClusterStore(redis.url, "test", 1.0)
        prefix = DesiredState(store).blob_prefix
        blobs = Blobs(store, prefix, Settings(max_load_files=2, max_model_bytes=1024))
        small = await blobs.put(b"x" * 100)
        with pytest.raises(BadRequest, match="names 3 files, over the limit of 2"):
            await blobs.fetch("m", {f"{i}/f": small for i in range(3)}, _held())
        with pytest.raises(BadRequest, match="not a sha256 digest"):
            await blobs.fetch("m", {"1/f": "../../other:key"}, _held())
        big = await blobs.put(b"y" * 1000)
        with pytest.raises(PayloadTooLarge, match="hold 1100 bytes, over the limit of 1024"):
            await blobs.fetch("m", {"1/a": small, "1/b": big}, _held())
        await store.redis.set(prefix + small, b"changed")  # not what its digest says
        with pytest.raises(BadRequest, match="is gone from the cluster store or changed there"):
            await blobs.fetch("m", {"1/a": small}, _held())
        await store.close()

    asyncio.run(scenario())


def test_a_fetch_holds_its_files_from_the_budget_before_reading_any(redis: RedisServer) -> None:
    """Files of 1,100 bytes against a budget of 1,000: refused (413) before one GET reaches
    Redis (its own command count says so); within the budget, held while the load has them."""

    async def gets(store: ClusterStore) -> int:
        return int((await store.redis.info("commandstats")).get("cmdstat_get", {}).get("calls", 0))

    async def scenario() -> None:
        store = ClusterStore(redis.url, "test", 1.0)
        blobs = Blobs(store, DesiredState(store).blob_prefix, Settings())
        files = {"1/a": await blobs.put(b"x" * 100), "1/b": await blobs.put(b"y" * 1000)}
        before = await gets(store)
        with pytest.raises(PayloadTooLarge, match="over the memory"):
            await blobs.fetch("m", files, _held(1000))
        assert await gets(store) == before
        held = _held(2000)
        fetched = await blobs.fetch("m", files, held)
        assert fetched == {"1/a": b"x" * 100, "1/b": b"y" * 1000}
        assert held.held == 1100 and await gets(store) == before + 2
        await store.close()

    asyncio.run(scenario())
