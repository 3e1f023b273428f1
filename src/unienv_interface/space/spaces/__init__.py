"""The concrete space classes."""
from .batched import BatchedSpace
from .binary import BinarySpace
from .box import BoxSpace
from .dict import DictSpace
from .text import TextSpace
from .tuple import TupleSpace

__all__ = ["BoxSpace", "BinarySpace", "DictSpace", "TupleSpace", "TextSpace", "BatchedSpace"]
