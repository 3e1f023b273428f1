"""Looking inside a stored dataset without knowing how it was written (used by the `unienv-data` commands).

`walk(path)` reads only metadata files: it detects what `path` holds (a `ReplayBuffer` directory, a `DictStorage`,
`FlattenedStorage`, `VideoStorage`, `ImageStorage`, a transformed or backend-adapter storage, or one raw `.memmap`
array file with its `.meta.json` sidecar), follows every nested storage the metadata names, and returns a tree of
`StorageNode`s: kind, registry name, format version, capacity, length, segments, the key paths each storage
holds, and every file with the size its metadata promises. Nothing is imported by a name read from a file and
no path outside the dataset directory is followed.

`describe(path)` turns that tree into a JSON-ready summary (space tree, storage per key, bytes per key, episodes,
format versions); `open_dataset(path)` opens the data itself read-only through the library's own `load_from`
(so every check the storages make on load applies) and reads rows or single keys by logical index.

Logical order: a `ReplayBuffer` is read oldest first (its own logical indices). A bare storage is read in row
order; when one of its segments wraps the ring, rows are rotated so that segment starts the order and no
recorded episode is split.

Modules, one job each (import everything from this package; the modules are private):

* `_records`: `StorageNode`, `FileRecord` and the metadata file names the walk recognises;
* `_space_json`: space JSON read without building a space (leaves, sizes, descriptions);
* `_metadata`: reading one metadata file onto a node, path and field checks;
* `_fill_leaves`: nodes of storages that hold files (arrays, video, images, HDF5, unknown types);
* `_walk`: `detect`, `walk` and the storages that hold other storages;
* `_summary`: episodes, bytes per key, `describe`;
* `_open`: `open_dataset`, `OpenedDataset`.
"""
from __future__ import annotations

from ._open import OpenedDataset, choose_backend, flatten_tree, open_dataset
from ._records import CHECKSUM_FILE, METADATA_BUCKET, FileRecord, StorageNode
from ._space_json import describe_leaf, is_image_leaf, leaf_items, space_tree_lines
from ._summary import bytes_per_key, describe, logical_episodes, raw_bytes_per_key
from ._walk import detect, walk

# also importable from here, outside `__all__` (the commands use some of them)
from ._records import (ARRAY_KINDS, DIRECTORY_METADATA, HDF5_ATTRIBUTE, HDF5_EXTENSIONS,  # noqa: F401
                       IMAGE_EXTENSIONS, SIDECAR_SUFFIX)
from ._open import storage_columns  # noqa: F401
from ._space_json import itemsize, leaf_nbytes  # noqa: F401
from ._summary import node_details, rotation  # noqa: F401
from ._walk import MAX_DEPTH, node_runs  # noqa: F401

__all__ = ["FileRecord", "StorageNode", "OpenedDataset", "walk", "detect", "describe", "open_dataset",
           "bytes_per_key", "raw_bytes_per_key", "logical_episodes", "space_tree_lines", "describe_leaf",
           "leaf_items", "is_image_leaf", "choose_backend", "flatten_tree", "CHECKSUM_FILE", "METADATA_BUCKET"]
