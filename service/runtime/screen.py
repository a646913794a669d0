"""Refuse what must never reach onnx: external data, segments, and graphs too big or too deep.

This walks the parsed protobuf messages only; no onnx function runs before it passes, because
onnx.checker (and the reference) may open the files that external data names.
"""

from collections.abc import Iterable, Iterator

from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, SparseTensorProto, TensorProto

from service.errors import InvalidInput, PayloadTooLarge

_GRAPH_KINDS = (AttributeProto.GRAPH, AttributeProto.GRAPHS)


def screen(model: ModelProto, max_nodes: int, max_depth: int) -> None:
    """422 on external data or a segment anywhere, or subgraphs nested deeper than `max_depth`;
    413 on more than `max_nodes` nodes in all graphs and functions together."""
    nodes = 0
    graphs: list[tuple[GraphProto, int, str]] = [(model.graph, 0, "graph")]
    for info in model.training_info:
        graphs += [(info.initialization, 0, "training_info"), (info.algorithm, 0, "training_info")]
    loose: list[tuple[NodeProto, int, str]] = []
    for function in model.functions:
        where = f"function {function.name[:100]!r}"
        loose += [(node, 0, where) for node in function.node]
        # attribute defaults of the function (attribute_proto) hold tensors and graphs too
        graphs += _attributes(function.attribute_proto, 0, f"{where}: default")
    while graphs or loose:
        if graphs:
            graph, depth, where = graphs.pop()
            if depth > max_depth:
                raise InvalidInput(f"subgraphs are nested deeper than {max_depth} levels "
                                   "(OPSERVE_MAX_GRAPH_DEPTH)")  # fmt: skip
            _tensors(graph.initializer, f"{where}: initializer")
            for sparse in graph.sparse_initializer:
                _sparse(sparse, f"{where}: sparse initializer")
            batch = [(node, depth, where) for node in graph.node]
        else:
            batch, loose = loose, []
        nodes += len(batch)
        if nodes > max_nodes:
            raise PayloadTooLarge(f"the model has over {max_nodes} nodes, over the limit "
                                  "(OPSERVE_MAX_GRAPH_NODES)")  # fmt: skip
        for node, depth, where in batch:
            graphs += _node(node, depth, where)


def _node(node: NodeProto, depth: int, where: str) -> Iterator[tuple[GraphProto, int, str]]:
    label = f"{where}: node {node.name[:100]!r} ({node.op_type[:100]})"
    yield from _attributes(node.attribute, depth, label)


def _attributes(attributes: Iterable[AttributeProto], depth: int,
                label: str) -> Iterator[tuple[GraphProto, int, str]]:  # fmt: skip
    for attr in attributes:
        here = f"{label}: attribute {attr.name[:100]!r}"
        if attr.HasField("t"):
            _tensors([attr.t], here)
        _tensors(attr.tensors, here)
        if attr.HasField("sparse_tensor"):
            _sparse(attr.sparse_tensor, here)
        for sparse in attr.sparse_tensors:
            _sparse(sparse, here)
        if attr.HasField("g"):
            yield attr.g, depth + 1, f"{here}: subgraph"
        for graph in attr.graphs:
            yield graph, depth + 1, f"{here}: subgraph"


def _sparse(sparse: SparseTensorProto, where: str) -> None:
    _tensors([sparse.values, sparse.indices], where)


def _tensors(tensors: Iterable[TensorProto], where: str) -> None:
    for tensor in tensors:
        if tensor.data_location == TensorProto.EXTERNAL or len(tensor.external_data):
            raise InvalidInput(f"{where}: tensor {tensor.name[:100]!r} uses external data, "
                               "which the service refuses")  # fmt: skip
        if tensor.HasField("segment"):
            raise InvalidInput(f"{where}: tensor {tensor.name[:100]!r} is a segment, "
                               "which the service refuses")  # fmt: skip
