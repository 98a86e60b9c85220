"""The seed architectures: bottleneck ResNets laid out exactly as AIPerf's resnet50.json.

AIPerf's seed (examples/trials/network_morphism/imagenet/resnet50.json) numbers node i + 1 as the
output of layer i and orders a projection block conv1, BN, ReLU, conv2, BN, ReLU, conv3, shortcut
conv, BN(conv3), BN(shortcut), Add, ReLU; an identity block conv3, BN, Add(BN output, block input).
"""

from __future__ import annotations

from mlhpc.benchmarks.aiperf.graph import (
    ADD,
    BN,
    CONV,
    DENSE,
    GLOBAL_POOL,
    POOL,
    RELU,
    Graph,
    Layer,
    check,
    output_shape,
)

EXPANSION = 4  # bottleneck: the block's output has 4x its inner width
STEMS = ("imagenet", "small")


class _Builder:
    """Appends layers, each writing a new node, as NNI's Graph.add_layer does."""

    def __init__(self, input_shape: tuple[int, int, int]) -> None:
        self.input_shape = input_shape
        self.nodes: list[tuple[int, ...]] = [tuple(input_shape)]
        self.layers: list[Layer] = []

    def add(self, kind: str, inputs: int | tuple[int, ...], *args: int) -> int:
        ins = inputs if isinstance(inputs, tuple) else (inputs,)
        layer = Layer(kind, ins, len(self.nodes), tuple(args))
        self.nodes.append(output_shape(layer, [self.nodes[i] for i in ins]))
        self.layers.append(layer)
        return layer.output

    def conv(self, node: int, out: int, kernel: int, stride: int) -> int:
        return self.add(CONV, node, self.nodes[node][-1], out, kernel, stride, kernel // 2)

    def bn(self, node: int) -> int:
        return self.add(BN, node, self.nodes[node][-1])

    def graph(self) -> Graph:
        graph = Graph(self.input_shape, tuple(self.nodes), tuple(self.layers))
        check(graph)
        return graph


def resnet(
    input_shape: tuple[int, int, int] = (224, 224, 3),
    classes: int = 1000,
    blocks: tuple[int, ...] = (3, 4, 6, 3),
    width: int = 64,
    stem: str = "imagenet",
) -> Graph:
    """A bottleneck ResNet: ResNet-50 as AIPerf's seed by default. Stage i has blocks[i] blocks of
    inner width width * 2**i, stride 2 from the second stage on (on the first 1x1 conv, as Keras'
    ResNet-50). stem "imagenet" is a 7x7/2 conv and 3x3/2 max pool; "small" (CIFAR-sized images) a
    3x3/1 conv without pooling."""
    if stem not in STEMS:
        raise ValueError(f"stem={stem!r}; expected one of {STEMS}")
    if not blocks or min(blocks) < 1 or width < 1 or classes < 1:
        raise ValueError(f"blocks={blocks}, width={width}, classes={classes}; expected positive values")
    b = _Builder(input_shape)
    if stem == "imagenet":
        x = b.add(RELU, b.bn(b.conv(0, width, 7, 2)))
        x = b.add(POOL, x, 3, 2, 0)
    else:
        x = b.add(RELU, b.bn(b.conv(0, width, 3, 1)))
    for stage, count in enumerate(blocks):
        inner = width * 2**stage
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            x = _bottleneck(b, x, inner, stride, project=index == 0)
    return _head(b, x, classes)


def _bottleneck(b: _Builder, x: int, inner: int, stride: int, project: bool) -> int:
    y = b.add(RELU, b.bn(b.conv(x, inner, 1, stride)))
    y = b.add(RELU, b.bn(b.conv(y, inner, 3, 1)))
    y = b.conv(y, inner * EXPANSION, 1, 1)
    if project:
        shortcut = b.conv(x, inner * EXPANSION, 1, stride)
        y, shortcut = b.bn(y), b.bn(shortcut)
        return b.add(RELU, b.add(ADD, (y, shortcut)))
    return b.add(RELU, b.add(ADD, (b.bn(y), x)))


def _head(b: _Builder, x: int, classes: int) -> Graph:
    pooled = b.add(GLOBAL_POOL, x)
    b.add(DENSE, pooled, b.nodes[pooled][0], classes)
    return b.graph()
