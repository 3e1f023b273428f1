"""`HFAsUniEnvDataset`: a Hugging Face `datasets.Dataset` as a read-only `BatchBase`.

`HFAsUniEnvDataset.create(hf_dataset, backend, device=None)` builds the space from the dataset's features, taking
from row 0 only what the features leave open (the length of a variable-length list, the size of an image), and
reads rows straight from the dataset's Arrow table. Each column keeps the dtype its feature declares: the numpy
formatter of `datasets` itself turns `Array2D(dtype="uint8")` into int64 and float64 batches into float32, so it
is not used.

Features and the spaces they become (a dict of features becomes a `DictSpace`, nested dicts nest):

| feature | space |
| --- | --- |
| `Value` of an integer or float dtype | `BoxSpace` of that dtype, shape `()`, the dtype's full range |
| `Value("bool")` | `BinarySpace`, shape `()` |
| `Value("string")` / `"large_string"` | `TextSpace` (max_length: the longest string, charset: the characters in the column) |
| `ClassLabel(names)` | int64 `BoxSpace` from 0 to `num_classes - 1` |
| `List` / `Sequence` / `LargeList` of numbers or bools, `Array2D` ... `Array5D` | a box of that element shape |
| `Image` | uint8 `BoxSpace` of the decoded image's shape (HWC, or HW for grayscale) |

A list without a fixed length takes its shape from row 0; a later row of another length raises ValueError naming
the row and the column (nothing is padded or cut). Other features (audio, video, nested lists of dicts, ...) raise
TypeError naming the column. Indices follow the library's rules (`unienv_data.base.indexing`): an index out of
range raises IndexError (the reference raised AssertionError).

`datasets` and pyarrow are needed only here (the `huggingface` extra).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from unienv_data.base.common import BatchBase, BatchT
from unienv_data.base.indexing import normalize_index
from unienv_data.batches._tree import set_path
from unienv_data.storages._list_helpers import require_module
from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace, Space, TextSpace

from ._arrow_columns import column_to_numpy, first_row_shape, unwrap

_WHO = "HFAsUniEnvDataset"
_NUMERIC = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"}
_TEXT = {"string", "large_string"}


def _pa() -> Any:
    return require_module("pyarrow", "huggingface", _WHO)


@dataclass(frozen=True)
class _Column:
    """How one leaf of a row is read: its key path, kind ("array", "text" or "image"), element shape and dtype."""

    path: Tuple[str, ...]
    kind: str
    shape: Tuple[int, ...]
    dtype: Optional[np.dtype]
    feature: Any = None

    @property
    def name(self) -> str:
        return ".".join(self.path)


def _bounds(dtype: np.dtype) -> Tuple[Any, Any]:
    if dtype.kind == "f":
        return -np.inf, np.inf
    info = np.iinfo(dtype)
    return info.min, info.max


def _column_of(table: Any, path: Tuple[str, ...]) -> Any:
    arr = table.column(path[0])
    for key in path[1:]:
        arr = unwrap(_pa(), arr).field(key)
    return arr


class _SpacePlanner:
    """Turns the features of a dataset (with its first row where they are open) into a space and column plan."""

    def __init__(self, first: Any, backend: Any, device: Any) -> None:
        self.first = first          # a pyarrow Table of the dataset's first row (or None when it is empty)
        self.backend = backend
        self.device = device
        self.columns: List[_Column] = []

    def box(self, path: Tuple[str, ...], shape: Tuple[int, ...], dtype: np.dtype, low: Any = None,
            high: Any = None) -> Space:
        if dtype == np.bool_:
            self.columns.append(_Column(path, "array", shape, dtype))
            return BinarySpace(self.backend, shape, device=self.device)
        lo, hi = _bounds(dtype)
        self.columns.append(_Column(path, "array", shape, dtype))
        return BoxSpace(self.backend, lo if low is None else low, hi if high is None else high, dtype,
                        device=self.device, shape=shape)

    def _row0_shape(self, path: Tuple[str, ...], depth: int, fixed: Sequence[Optional[int]]) -> Tuple[int, ...]:
        if all(d is not None and d >= 0 for d in fixed):
            return tuple(int(d) for d in fixed)  # type: ignore[arg-type]
        if self.first is None or self.first.num_rows == 0:
            raise ValueError(f"column {'.'.join(path)!r} has a variable-length feature and the dataset is empty, "
                             "so its shape is unknown")
        got = first_row_shape(_pa(), _column_of(self.first, path), depth)
        if len(got) != depth:
            raise ValueError(f"column {'.'.join(path)!r}: row 0 does not nest {depth} list levels deep")
        return tuple(int(f) if f is not None and f >= 0 else g for f, g in zip(fixed, got))

    def feature(self, path: Tuple[str, ...], feat: Any) -> Space:
        features = require_module("datasets.features", "huggingface", _WHO)
        name = ".".join(path)
        if isinstance(feat, dict):
            return DictSpace(self.backend, {k: self.feature(path + (k,), v) for k, v in feat.items()},
                             device=self.device)
        if isinstance(feat, features.Value):
            if feat.dtype in _TEXT:
                return self.text(path)
            if feat.dtype == "bool" or feat.dtype in _NUMERIC:
                return self.box(path, (), np.dtype(feat.dtype))
            raise TypeError(f"column {name!r} holds Value({feat.dtype!r}); only numbers, bools and strings can be "
                            "read (cast or drop the column first)")
        if isinstance(feat, features.ClassLabel):
            return self.box(path, (), np.dtype(np.int64), 0, max(int(feat.num_classes) - 1, 0))
        if isinstance(feat, (features.List, features.LargeList)):
            dims: List[Optional[int]] = []
            inner = feat
            while isinstance(inner, (features.List, features.LargeList)):
                length = getattr(inner, "length", -1)
                dims.append(None if length is None or length < 0 else int(length))
                inner = inner.feature
            if not (isinstance(inner, features.Value) and (inner.dtype == "bool" or inner.dtype in _NUMERIC)):
                raise TypeError(f"column {name!r} is a list of {inner!r}; only lists of numbers or bools can be read")
            return self.box(path, self._row0_shape(path, len(dims), dims), np.dtype(inner.dtype))
        array_types = tuple(getattr(features, f"Array{k}D") for k in (2, 3, 4, 5))
        if isinstance(feat, array_types):
            fixed = [None if d is None else int(d) for d in feat.shape]
            return self.box(path, self._row0_shape(path, len(fixed), fixed), np.dtype(feat.dtype))
        if isinstance(feat, features.Image):
            return self.image(path, feat)
        raise TypeError(f"column {name!r} has the feature {type(feat).__name__}, which {_WHO} cannot read "
                        "(numbers, bools, strings, class labels, lists, ArrayND and Image are supported)")

    def text(self, path: Tuple[str, ...]) -> Space:
        self.columns.append(_Column(path, "text", (), None))
        return TextSpace(self.backend, 0, device=self.device)  # sized from the column (see _set_text_spaces)

    def image(self, path: Tuple[str, ...], feat: Any) -> Space:
        if self.first is None or self.first.num_rows == 0:
            raise ValueError(f"column {'.'.join(path)!r} holds images and the dataset is empty, so their size is "
                             "unknown")
        frame = _decode_images(_column_of(self.first, path), feat, ".".join(path))[0]
        self.columns.append(_Column(path, "image", frame.shape, np.dtype(np.uint8), feat))
        return BoxSpace(self.backend, 0, 255, np.uint8, device=self.device, shape=frame.shape)


def _decode_images(arr: Any, feat: Any, where: str) -> List[np.ndarray]:
    """The frames of an `Image` column (Arrow structs of bytes and path), decoded by the feature itself."""
    out = []
    for i, item in enumerate(unwrap(_pa(), arr).to_pylist()):
        if item is None:
            raise ValueError(f"{where}: row {i} holds no image (null)")
        frame = np.asarray(feat.decode_example(item))
        if frame.dtype != np.uint8:
            raise ValueError(f"{where}: row {i} decodes to {frame.dtype} pixels; only 8-bit images can be read")
        out.append(frame)
    return out


def _set_text_spaces(space: Space, table: Any, columns: Sequence[_Column]) -> Space:
    """The space with every TextSpace sized to its column: max_length the longest string, charset the characters
    that occur (so the space describes the data exactly, and storages that need a charset can hold it)."""
    pc = require_module("pyarrow.compute", "huggingface", _WHO)
    found: Dict[Tuple[str, ...], Tuple[int, str]] = {}
    for col in columns:
        if col.kind == "text":
            uniq = [v for v in pc.unique(unwrap(_pa(), _column_of(table, col.path))).to_pylist() if v is not None]
            found[col.path] = (max((len(v) for v in uniq), default=0), "".join(sorted(set("".join(uniq)))))

    def fix(sp: Space, path: Tuple[str, ...]) -> Space:
        if isinstance(sp, DictSpace):
            return DictSpace(sp.backend, {k: fix(v, path + (k,)) for k, v in sp.spaces.items()}, device=sp.device)
        if isinstance(sp, TextSpace):
            longest, chars = found.get(path, (0, ""))
            return TextSpace(sp.backend, longest, charset=chars or None, device=sp.device)
        return sp
    return fix(space, ())


def _episode_runs(arrow: Any, name: str) -> List[Tuple[int, int]]:
    """Maximal runs of equal values of the integer column `name`, as `(start, end)` rows; an episode whose rows
    are not contiguous raises ValueError (sort the dataset by episode first)."""
    if name not in arrow.column_names:
        raise KeyError(f"episode_column {name!r} is not a column of the dataset; its columns are {arrow.column_names}")
    col = arrow[:].column(name)
    values = column_to_numpy(_pa(), col, (), np.dtype(np.int64) if _pa().types.is_signed_integer(col.type) else
                             np.dtype(np.uint64), f"{_WHO}: episode_column {name!r}")
    if values.size == 0:
        return []
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [values.size]])
    uniq, counts = np.unique(values[starts], return_counts=True)
    if (counts > 1).any():
        dup = int(uniq[counts > 1][0])
        raise ValueError(f"{_WHO}: the rows of episode {dup} in column {name!r} are not contiguous; sort the "
                         "dataset by that column first (hf_dataset.sort(...))")
    return [(int(a), int(b)) for a, b in zip(starts, ends)]


class HFAsUniEnvDataset(BatchBase[BatchT, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """A read-only `BatchBase` over a Hugging Face `datasets.Dataset` (see the module docstring)."""

    is_mutable = False

    @staticmethod
    def create(hf_dataset: Any, backend: Any, device: Any = None, *,
               episode_column: Optional[str] = None) -> "HFAsUniEnvDataset":
        """The dataset as a batch of `backend` arrays on `device`; its space comes from the features (and row 0).

        `episode_column` names an integer column (LeRobot's `episode_index`) whose runs of equal values are the
        episodes: `get_segments()` then reports them, so samplers and `convert` keep them. Without it the
        dataset has no segments (as in the reference)."""
        datasets = require_module("datasets", "huggingface", _WHO)
        if not isinstance(hf_dataset, datasets.Dataset):
            raise TypeError(f"hf_dataset must be a datasets.Dataset, got {type(hf_dataset).__name__} (an "
                            "IterableDataset or DatasetDict is not indexable by row: pick a split first)")
        arrow = hf_dataset.with_format("arrow")
        first = arrow[0:1] if len(hf_dataset) else None
        planner = _SpacePlanner(first, backend, device)
        space = planner.feature((), dict(hf_dataset.features))
        if any(c.kind == "text" for c in planner.columns):
            space = _set_text_spaces(space, arrow[:], planner.columns)
        segments = None if episode_column is None else _episode_runs(arrow, episode_column)
        return HFAsUniEnvDataset(hf_dataset, space, planner.columns, segments)

    def __init__(self, hf_dataset: Any, space: Space, columns: Optional[Sequence[_Column]] = None,
                 segments: Optional[List[Tuple[int, int]]] = None) -> None:
        if columns is None:
            raise TypeError(f"build an {_WHO} with {_WHO}.create(hf_dataset, backend, device)")
        super().__init__(space)
        self.hf_dataset = hf_dataset
        self._arrow = hf_dataset.with_format("arrow")
        self._columns = list(columns)
        self._segments = segments

    def get_segments(self) -> Optional[List[Tuple[int, int]]]:
        """The episodes of `episode_column` as `(start, end)` row ranges, or None (no episode column given)."""
        return None if self._segments is None else list(self._segments)

    def __len__(self) -> int:
        return len(self.hf_dataset)

    def _table(self, idx: Any) -> Tuple[Any, bool, int]:
        """`(Arrow table of the rows at idx, whether idx is one row, the first row's number)`."""
        norm = normalize_index(idx, len(self))
        if norm.single is not None:
            return self._arrow[norm.single:norm.single + 1], True, norm.single
        if norm.slc is not None and norm.slc.step == 1:
            return self._arrow[norm.slc.start:norm.slc.stop], False, norm.slc.start
        pos = norm.positions()
        if pos.size == 0:
            return self._arrow[0:0], False, 0
        return self._arrow[pos.tolist()], False, 0

    def _leaf(self, table: Any, col: _Column, row0: int) -> Any:
        where = f"{_WHO}: column {col.name!r}"
        arr = _column_of(table, col.path)
        if col.kind == "text":
            out = np.empty(len(arr), dtype=object)
            out[:] = unwrap(_pa(), arr).to_pylist()
            return out
        if col.kind == "image":
            frames = _decode_images(arr, col.feature, where)
            for i, f in enumerate(frames):
                if f.shape != col.shape:
                    raise ValueError(f"{where}: row {row0 + i} is an image of shape {f.shape}; the space (from row "
                                     f"0) has {col.shape}")
            data = np.stack(frames) if frames else np.zeros((0,) + col.shape, np.uint8)
        else:
            data = column_to_numpy(_pa(), arr, col.shape, col.dtype, where, row0)
        return self.backend.from_numpy(np.ascontiguousarray(data), device=self.device)

    def get_at(self, idx: Any) -> Any:
        """Row(s) at `idx` as nested dicts of backend arrays (strings as `str`, or object arrays in a batch)."""
        table, single, row0 = self._table(idx)
        out: Dict[str, Any] = {}
        for col in self._columns:
            value = self._leaf(table, col, row0)
            if single:
                value = value[0] if col.kind == "text" else value[0, ...]  # a 0-d array, not a NumPy scalar
            set_path(out, col.path, value)
        return out

    def get_at_with_metadata(self, idx: Any) -> Tuple[Any, Dict[str, Any]]:
        return self.get_at(idx), {}

    def get_column(self, nested_keys: Any) -> BatchBase:
        """A read-only view of one column (a dotted name or a key path); only that column is read."""
        from unienv_data.batches import SubItemBatch
        keys = [nested_keys] if isinstance(nested_keys, str) else [str(k) for k in nested_keys]
        if not isinstance(self.single_space, DictSpace) or not keys:
            return super().get_column(nested_keys)
        top_names = self.single_space.spaces
        joined = ".".join(keys)
        if joined in top_names:              # a column whose name holds dots (LeRobot's "observation.state")
            path: Tuple[str, ...] = (joined,)
        elif len(keys) == 1 and keys[0] not in top_names:
            path = tuple(keys[0].split("."))  # "extra.gear": a dotted path into a nested column
        else:
            path = tuple(keys)
        if path[0] not in top_names:
            return super().get_column(nested_keys)
        top = path[0]
        view: HFAsUniEnvDataset[Any, Any, Any, Any, Any] = HFAsUniEnvDataset(
            self.hf_dataset.select_columns([top]),
            DictSpace(self.backend, {top: self.single_space.spaces[top]}, device=self.device),
            [c for c in self._columns if c.path[0] == top], self._segments)
        return SubItemBatch(view, list(path))


__all__ = ["HFAsUniEnvDataset"]
