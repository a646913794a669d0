"""The cluster-mode pieces of one process, made from the settings when
OPSERVE_CLUSTER_REDIS_URL is set, started and stopped by the app's lifespan."""

import contextlib

from service.cluster.members import Membership
from service.cluster.response_cache import RedisCache
from service.cluster.statistics import ClusterStatistics
from service.cluster.store import ClusterStore, ClusterUnreachable
from service.codecs.limits import Limits
from service.core.statistics import Statistics
from service.settings import Settings


class Cluster:
    """This process's connection to the cluster store and its membership."""

    def __init__(self, settings: Settings) -> None:
        url = settings.cluster_redis_url.get_secret_value()
        self.store = ClusterStore(url, settings.cluster_name, settings.cluster_timeout_seconds)
        self.members = Membership(self.store, settings.cluster_heartbeat_seconds)
        self.settings = settings
        self.statistics: ClusterStatistics | None = None  # share_statistics() makes it

    def share_statistics(self, local: Statistics) -> ClusterStatistics:
        """The cluster's statistics over this process's `local` counts (written from start()
        to stop()), for the data plane's stats call."""
        self.statistics = ClusterStatistics(self.store, self.members, local,
                                            self.settings.cluster_statistics_seconds)  # fmt: skip
        return self.statistics

    def response_cache(self, limits: Limits) -> RedisCache:
        """The response cache's store in the cluster store (OPSERVE_RESPONSE_CACHE_*)."""
        settings = self.settings
        return RedisCache(self.store, settings.response_cache_bytes,
                          settings.response_cache_seconds, limits)  # fmt: skip

    async def start(self) -> None:
        """Register (a Redis away at start-up is no failure: the heartbeat keeps trying, and
        what needs the store answers 503 meanwhile)."""
        with contextlib.suppress(ClusterUnreachable):
            await self.members.beat()
        self.members.start()
        if self.statistics is not None:
            self.statistics.start()

    async def stop(self) -> None:
        if self.statistics is not None:
            await self.statistics.stop()
        await self.members.stop()
        await self.store.close()
