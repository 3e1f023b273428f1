"""The concrete space classes (and, as in unienv 0.0.1b16, the `Space` base and `SpaceMetadata`, so that
`from unienv_interface.space.spaces import *` brings every name a space annotation needs)."""
from ..metadata import SpaceMetadata
from ..space import Space
from .batched import BatchedSpace
from .binary import BinarySpace
from .box import BoxSpace
from .dict import DictSpace
from .dynamic_box import DynamicBoxSpace
from .graph import GraphInstance, GraphSpace
from .text import TextSpace
from .tuple import TupleSpace
from .union import UnionSpace

__all__ = ["Space", "SpaceMetadata", "BoxSpace", "BinarySpace", "DynamicBoxSpace", "DictSpace", "GraphSpace",
           "GraphInstance", "TupleSpace", "TextSpace", "UnionSpace", "BatchedSpace"]
