"""What walking a dataset produces: `StorageNode` (one storage) and `FileRecord` (one of its files), and the file
names and kinds the walk recognises."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ._space_json import leaf_items

#: metadata file name -> short kind, in the order a directory is probed
DIRECTORY_METADATA: Tuple[Tuple[str, str], ...] = (
    ("metadata.json", "ReplayBuffer"),
    ("dict_storage_metadata.json", "DictStorage"),
    ("flattened_metadata.json", "FlattenedStorage"),
    ("video_metadata.json", "VideoStorage"),
    ("image_metadata.json", "ImageStorage"),
    ("transformed_metadata.json", "TransformedStorage"),
    ("backend_metadata.json", "ToBackendOrDeviceStorage"),
)
SIDECAR_SUFFIX = ".meta.json"
ARRAY_KINDS = ("PytorchTensorStorage", "NumpyMemmapStorage")
IMAGE_EXTENSIONS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp"}
#: where `unienv-data verify --write-checksums` puts checksums (`sha256sum` format, paths relative to the root)
CHECKSUM_FILE = "checksums.sha256"
HDF5_EXTENSIONS = (".hdf5", ".h5")
#: the root attribute where HDF5Storage keeps this library's bookkeeping (JSON)
HDF5_ATTRIBUTE = "unienv_storage"
METADATA_BUCKET = "(metadata)"


@dataclass
class FileRecord:
    """One file of a storage: its size now and what the metadata promises (None: no promise)."""

    rel: str                               #: path relative to the dataset root
    role: str                              #: "metadata", "data", "video", "image" or "other"
    size: Optional[int]                    #: bytes on disk, None when missing
    expected: Optional[int] = None         #: exact size promised by the metadata
    minimum: Optional[int] = None          #: smallest size that holds what the metadata promises
    detail: str = ""                       #: what the promise is (e.g. "500 rows of uint8[64, 64, 3]")
    sha256: Optional[str] = None           #: checksum recorded in the metadata, if any


@dataclass
class StorageNode:
    """One storage (or the replay buffer) found while walking a dataset."""

    rel: str                               #: its file or directory, relative to the dataset root ("." for the root)
    kind: str                              #: short class name ("DictStorage", "PytorchTensorStorage", ...)
    storage_type: str                      #: the name its metadata uses (registry name)
    format_version: Optional[int] = None
    metadata_rel: Optional[str] = None
    meta: Dict[str, Any] = field(default_factory=dict)
    key: Optional[str] = None              #: its key in the parent DictStorage's storage map
    prefix: Tuple[str, ...] = ()           #: where its space sits in the dataset's space
    space_json: Optional[Dict[str, Any]] = None
    capacity: Optional[int] = None
    length: Optional[int] = None
    runs: Optional[List[Tuple[int, int]]] = None  #: recorded segments as physical (start, length)
    files: List[FileRecord] = field(default_factory=list)
    children: List["StorageNode"] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    depth: int = 0                         #: how many storages lie above it

    def iter(self) -> Iterator["StorageNode"]:
        """This node and every node below it, depth first."""
        yield self
        for c in self.children:
            yield from c.iter()

    @property
    def leaves(self) -> List[str]:
        """Key paths (joined with "/") of the space leaves this storage holds."""
        if self.space_json is None:
            return ["/".join(self.prefix)] if self.prefix else []
        return ["/".join(self.prefix + p) or "<value>" for p, _ in leaf_items(self.space_json)]

    def nbytes(self, roles: Sequence[str] = ("data", "video", "image", "other", "metadata")) -> int:
        """Bytes on disk of this node's files and those below it (only the given roles)."""
        return sum(f.size or 0 for n in self.iter() for f in n.files if f.role in roles)
