"""What a model's `dynamic_batching` block asks of its batcher (core/batcher.py), read once
from the completed configuration: batch sizes, the queue delay, ordering, priority levels and
each level's queue policy. Triton's meanings (model_config.proto, core's
dynamic_batch_scheduler.cc and scheduler_utils.cc), which docs/v2.md lists field by field."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api_schemas.v2 import Parameter
from service.errors import InvalidInput

REJECT, DELAY = 0, 1  # ModelQueuePolicy.TimeoutAction


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One priority level's ModelQueuePolicy."""

    max_queue_size: int = 0  # 0: no bound of the config's own (the server's still holds)
    timeout_action: int = REJECT
    default_timeout_us: int = 0  # 0: a request never times out in the queue
    allow_timeout_override: bool = False

    def timeout_us(self, requested: int) -> int:
        """A request's time in the queue: the level's default, or the request's `timeout`
        when the level allows it and it is shorter (Triton: an override may shorten the
        default, never lengthen it; with no default there is nothing to shorten)."""
        if self.allow_timeout_override and 0 < requested < self.default_timeout_us:
            return requested
        return self.default_timeout_us


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """A model's dynamic batching: rows per batch, when to run a batch, how requests queue."""

    max_batch_size: int
    preferred: frozenset[int]
    delay_ns: int  # max_queue_delay_microseconds
    preserve_ordering: bool
    levels: int  # priority levels (1 when the config names none)
    default_level: int  # 1-based
    policies: tuple[QueuePolicy, ...]  # one per level, index level - 1
    instances: int  # batches that may run at once (the instance groups' counts)

    @property
    def max_preferred(self) -> int:
        """The largest preferred batch size (Triton completes an empty list with
        max_batch_size: runtime/config/complete.py)."""
        return max(self.preferred, default=self.max_batch_size)

    def level(self, parameters: Mapping[str, Parameter]) -> int:
        """A request's priority level: its `priority` parameter, or the default level when it
        is 0 or past the levels (Triton's InferenceRequest::SetPriority)."""
        priority = parameters.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise InvalidInput("invalid value for 'priority', expected value >= 0.")
        return priority if 0 < priority <= self.levels else self.default_level

    def timeout_us(self, level: int, parameters: Mapping[str, Parameter]) -> int:
        """How long the request may wait in its level's queue (0: no limit)."""
        requested = parameters.get("timeout", 0)
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
            raise InvalidInput("invalid value for 'timeout', expected value >= 0.")
        return self.policies[level - 1].timeout_us(requested)


def batch_policy(config: Any) -> BatchPolicy | None:
    """The batching a completed ModelConfig asks for: its dynamic_batching, or its sequence
    batcher's `oldest` strategy (which batches the steps of different sequences, one step of a
    sequence at a time: a sequence's turn holds its next step back); None when it asks for
    neither or does not batch (max_batch_size 0)."""
    if config is None or config.max_batch_size <= 0:
        return None
    instances = sum(max(1, group.count) for group in config.instance_group) or 1
    if config.HasField("sequence_batching"):
        if not config.sequence_batching.HasField("oldest"):
            return None  # direct: each step alone, as Triton's direct strategy with no batching
        oldest = config.sequence_batching.oldest
        return BatchPolicy(max_batch_size=config.max_batch_size,
                           preferred=frozenset(oldest.preferred_batch_size),
                           delay_ns=oldest.max_queue_delay_microseconds * 1000,
                           preserve_ordering=oldest.preserve_ordering, levels=1,
                           default_level=1, policies=(QueuePolicy(),),
                           instances=instances)  # fmt: skip
    if not config.HasField("dynamic_batching"):
        return None
    dynamic = config.dynamic_batching
    levels = max(1, dynamic.priority_levels)
    default = _queue_policy(dynamic.default_queue_policy)
    policies = tuple(_queue_policy(dynamic.priority_queue_policy[level])
                     if level in dynamic.priority_queue_policy else default
                     for level in range(1, levels + 1))  # fmt: skip
    default_level = dynamic.default_priority_level if dynamic.priority_levels else 1
    return BatchPolicy(max_batch_size=config.max_batch_size,
                       preferred=frozenset(dynamic.preferred_batch_size),
                       delay_ns=dynamic.max_queue_delay_microseconds * 1000,
                       preserve_ordering=dynamic.preserve_ordering, levels=levels,
                       default_level=max(1, min(default_level, levels)), policies=policies,
                       instances=instances)  # fmt: skip


def _queue_policy(policy: Any) -> QueuePolicy:
    return QueuePolicy(max_queue_size=policy.max_queue_size,
                       timeout_action=DELAY if policy.timeout_action == DELAY else REJECT,
                       default_timeout_us=policy.default_timeout_microseconds,
                       allow_timeout_override=policy.allow_timeout_override)  # fmt: skip
