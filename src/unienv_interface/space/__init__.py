"""Spaces: typed descriptions of samples, and the utilities that batch, flatten and serialize them."""
from .metadata import SpaceMetadata
from .space import Space
from .spaces import BatchedSpace, BinarySpace, BoxSpace, DictSpace, TextSpace, TupleSpace

__all__ = ["Space", "SpaceMetadata", "BoxSpace", "BinarySpace", "DictSpace", "TupleSpace", "TextSpace", "BatchedSpace"]
