"""Spaces: typed descriptions of samples, and the utilities that batch, flatten and serialize them."""
from .metadata import SpaceMetadata
from .space import Space
from .spaces import (BatchedSpace, BinarySpace, BoxSpace, DictSpace, DynamicBoxSpace, GraphInstance, GraphSpace,
                     TextSpace, TupleSpace, UnionSpace)

__all__ = ["Space", "SpaceMetadata", "BoxSpace", "BinarySpace", "DynamicBoxSpace", "DictSpace", "GraphSpace",
           "GraphInstance", "TupleSpace", "TextSpace", "UnionSpace", "BatchedSpace"]
