"""An app's data plane joined to the cluster: the pieces that cluster mode puts in place of one
process's (statistics summed over the replicas, sequences and the response cache kept in Redis,
repository control on every replica). service/main.py imports this module only in cluster
mode: redis-py, and the OpenTelemetry SDK that it imports, are a fifth of a second of every
start of a process that needs neither."""

from service.cluster.cluster import Cluster
from service.cluster.repository import ClusterRepository, cluster_repository
from service.cluster.sequences import ClusterSequences
from service.codecs.limits import Limits
from service.core.dataplane import DataPlane
from service.runtime.repository import ModelRepository
from service.settings import Settings


def join_cluster(settings: Settings, plane: DataPlane, repository: ModelRepository,
                 limits: Limits) -> tuple[Cluster, ClusterRepository | None]:  # fmt: skip
    """The cluster of OPSERVE_CLUSTER_REDIS_URL, its pieces in `plane`; and its repository
    control (cluster + explicit model control only)."""
    cluster = Cluster(settings)
    shared = cluster_repository(cluster, plane, repository, settings)
    # the stats call answers the sum over the cluster's live replicas
    plane.shared_stats = cluster.share_statistics(plane.stats)
    # sequences kept in the cluster store, so any replica steps them
    local = plane.local_sequences
    plane.sequences = ClusterSequences(
        cluster.store, cluster.members, local.claims, settings.cluster_sequence_lease_seconds,
        max_waiting=local.max_waiting, max_state_bytes=local.max_state_bytes,
        max_sequences=settings.max_sequences,
        max_total_bytes=int(settings.memory_budget_bytes * settings.sequence_state_share),
        max_idle_seconds=settings.cluster_sequence_max_idle_seconds)  # fmt: skip
    if plane.cache is not None:  # one response cache for every replica, in Redis
        plane.cache.store = cluster.response_cache(limits)
    return cluster, shared
