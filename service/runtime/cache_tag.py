"""Whether a repository model version's answers may be cached (the response cache,
core/response_cache.py), and the digest its cache entries are keyed by."""

from collections.abc import Iterator
from typing import Any

import onnx

from service.runtime.digest import digest_of

RANDOM_OPS = frozenset({"RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
                        "Multinomial", "Bernoulli"})  # fmt: skip
"""Operators whose outputs differ from run to run. A `seed` does not make them repeat:
onnxruntime seeds its generator once per session and draws on from it at every run."""


def cache_tag(data: bytes, config: Any) -> bytes | None:
    """The digest of the model file and its completed configuration when the configuration
    enables the response cache and the graph is deterministic; else None (never cached).
    Sequence models are refused with the cache on (config/checks.py)."""
    if not config.response_cache.enable or config.HasField("sequence_batching"):
        return None
    model = onnx.ModelProto.FromString(data)
    graphs = [model.graph, *(_subgraphs(model.graph))]
    nodes = [n for g in graphs for n in g.node]
    nodes += [n for f in model.functions for n in f.node]
    if any(node.op_type in RANDOM_OPS for node in nodes):
        return None
    return digest_of(data, config.SerializeToString(deterministic=True))


def _subgraphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Every graph nested in `graph`'s nodes (If, Loop, Scan bodies), at any depth."""
    for node in graph.node:
        for attribute in node.attribute:
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield sub
                yield from _subgraphs(sub)
