"""A graph's nodes with those of its subgraphs (If's branches, Loop's and Scan's bodies), for
the checks that look at every node of a model; their nesting is bounded by screen() before
any walk (screen.py walks on its own: it must not trust the nesting it bounds)."""

from collections.abc import Iterator

from onnx import GraphProto, NodeProto


def subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    """The graphs the node's attributes hold, in attribute order."""
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        else:
            yield from attribute.graphs


def every_node(graph: GraphProto) -> Iterator[NodeProto]:
    """Every node of the graph and of its subgraphs, each node before its subgraphs' nodes."""
    for node in graph.node:
        yield node
        for inner in subgraphs(node):
            yield from every_node(inner)
