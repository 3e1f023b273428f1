"""`NPZStorage`: one `.npz` file per row of a Box / Binary space (reference-api §5.6).

Layout of the storage directory (the reference's, plus fields it ignores)::

    npz_metadata.json   {"storage_type": "NPZStorage", "compressed", "capacity", "length",
                         "format_version", "dtype", "shape", "written": [[start, n], ...], "segments": [[start, n], ...]}
    <row>.npz           the row, as the array "data" (np.savez / np.savez_compressed)

Any backend: rows are stored as NumPy arrays and returned in the space's backend. Differences from the reference
(see `_list_storage`): a row that was written but whose file is missing or damaged raises an error naming the file
(never zeros); a file holding another dtype or shape is refused (never cast); `dumps(path)` into another directory
works; segments are recorded.
"""
from __future__ import annotations

from unienv_interface.backends.base import BArrayType, BDeviceType, BDtypeType, BRNGType
import math
import os
import threading
import zipfile
from typing import Any, Dict, Optional

import numpy as np

from unienv_data.base.errors import StorageFormatError
from unienv_data.base.files import PathLike
from unienv_data.base.registry import register_storage
from unienv_interface.space import Space

from ._array_file import fill_from_stream
from ._list_helpers import prepare_new_directory
from ._list_storage import ListStorageBase, check_capacity

METADATA_FILE = "npz_metadata.json"


@register_storage
class NPZStorage(ListStorageBase[BArrayType, BArrayType, BDeviceType, BDtypeType, BRNGType]):
    """Rows of a Box / Binary space, one `<row>.npz` file each (see the module docstring).

    `create(space, *, compressed=True, capacity=None, cache_path (a new or empty directory), multiprocessing=False)`;
    `load_from(path, space, *, capacity=None, read_only=True, multiprocessing=False, missing_ok=False)`.
    `capacity=None` makes a growable storage. Batched reads and writes run on the shared IO pool. Rows never
    written read as zeros; `missing_ok=True` also reads rows without a file in a reference-written directory as
    zeros (the reference's behaviour; by default such a row raises, since it may be a lost file).
    """

    file_ext = "npz"
    metadata_file = METADATA_FILE
    reference_type = "NPZStorage"

    def __init__(self, single_instance_space: Space, directory: str, capacity: Optional[int], length: int,
                 written: Optional[np.ndarray] = None, segments: Any = None, *, compressed: bool = True,
                 read_only: bool = False, zero_unwritten: bool = True, owner: bool = True) -> None:
        super().__init__(single_instance_space, directory, capacity, length, written, segments, read_only=read_only,
                         zero_unwritten=zero_unwritten, owner=owner)
        self.compressed = bool(compressed)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, single_instance_space: Space, *args: Any, compressed: bool = True, capacity: Optional[int] = None,
               cache_path: Optional[PathLike] = None, multiprocessing: bool = False, **kwargs: Any) -> "NPZStorage":
        """A new, empty storage in the directory `cache_path` (created; it must be new or empty)."""
        if args:
            raise TypeError(f"{cls.__name__}.create() takes no extra positional arguments, got {args!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}.create() got unexpected keyword argument(s) {sorted(kwargs)}")
        if not isinstance(compressed, (bool, np.bool_)):
            raise TypeError(f"compressed must be a bool, got {compressed!r}")
        cap = check_capacity(capacity)
        directory = prepare_new_directory(cache_path, cls.__name__)
        st = cls(single_instance_space, directory, cap, 0, compressed=bool(compressed))
        st.flush()
        return st

    @classmethod
    def load_from(cls, path: PathLike, single_instance_space: Space, *, capacity: Optional[int] = None,
                  read_only: bool = True, multiprocessing: bool = False, missing_ok: bool = False,
                  compressed: Optional[bool] = None, **kwargs: Any) -> "NPZStorage":
        """Opens a directory written by this library or by the reference (see the class docstring). `compressed`
        (as the reference takes it) chooses how rows written from now on are saved; None keeps the stored choice."""
        if kwargs:
            raise TypeError(f"{cls.__name__}.load_from() got unexpected keyword argument(s) {sorted(kwargs)}")
        if compressed is not None and not isinstance(compressed, (bool, np.bool_)):
            raise TypeError(f"compressed must be a bool or None, got {compressed!r}")
        info = cls._read_metadata(path, single_instance_space, capacity, missing_ok)
        stored = info["meta"].get("compressed", True)
        if not isinstance(stored, bool):
            raise StorageFormatError(f"{os.path.join(os.fspath(path), METADATA_FILE)}: 'compressed' must be a bool, "
                                     f"got {stored!r}")
        compressed = stored if compressed is None else bool(compressed)
        return cls(single_instance_space, os.fspath(path), info["capacity"], info["length"], info["written"],
                   info["segments"], compressed=compressed, read_only=read_only,
                   zero_unwritten=info["zero_unwritten"])

    # ------------------------------------------------------------------ files
    def _options(self) -> Dict[str, Any]:
        return {"compressed": self.compressed}

    def _restore_options(self, options: Dict[str, Any]) -> None:
        self.compressed = bool(options.get("compressed", True))

    def _encode(self, path: str, arr: np.ndarray) -> None:
        with open(path, "wb") as f:
            if self.compressed:
                np.savez_compressed(f, data=arr)
            else:
                np.savez(f, data=arr)

    def _decode(self, path: str) -> np.ndarray:
        try:
            return _read_npz_data(path)
        except (FileNotFoundError, StorageFormatError):
            raise
        except (zipfile.BadZipFile, EOFError, ValueError, OSError, KeyError) as exc:
            raise StorageFormatError(f"{path} is not a readable .npz file ({type(exc).__name__}: {exc}); the file is "
                                     "truncated or damaged") from None


#: NumPy parses a .npy header with `ast.literal_eval`; CPython 3.11's AST constructor is not thread-safe (rows are
#: decoded by a thread pool, and concurrent parses raised "SystemError: AST constructor recursion depth mismatch",
#: CPython gh-106905), so header parses take turns. Decompression and copying run in parallel.
_HEADER_PARSE = threading.Lock()


def _read_npz_data(path: str) -> np.ndarray:
    """The array `data` of an .npz row file, read without pickles: `np.load` would do the same, except that its
    header parse is not safe in threads on CPython 3.11 (see `_HEADER_PARSE`)."""
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as raw:    # FileNotFoundError passes through
            magic = raw.read(6)
        if magic == b"\x93NUMPY":
            raise StorageFormatError(f"{path} is a plain .npy file, not an .npz archive holding 'data'")
        raise StorageFormatError(f"{path} is not an .npz archive; the file is truncated or damaged")
    with zipfile.ZipFile(path) as zf:
        if "data.npy" not in zf.namelist():
            names = [n[:-4] if n.endswith(".npy") else n for n in zf.namelist()]
            raise StorageFormatError(f"{path} holds the arrays {names}, not 'data': it is not a row of an NPZStorage")
        with zf.open("data.npy") as member:
            f: Any = member             # a ZipExtFile: a buffered reader with readinto
            version = np.lib.format.read_magic(f)
            with _HEADER_PARSE:
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise StorageFormatError(f"{path}: .npy format version {version} is not supported (1.0, 2.0)")
            if dtype.hasobject:
                raise StorageFormatError(f"{path} holds Python objects (dtype {dtype}); rows hold plain arrays only")
            out = np.empty(math.prod(shape), dtype=dtype)
            fill_from_stream(f, out, f"array 'data' of {path}")
    return out.reshape(shape[::-1]).T if fortran else out.reshape(shape)


__all__ = ["NPZStorage"]
