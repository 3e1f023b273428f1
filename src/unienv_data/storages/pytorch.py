"""`PytorchTensorStorage`: rows of a torch Box / Binary space in one array (memory-mapped file, RAM or shared
memory), returned as torch tensors.

Files keep the reference layout (raw `.memmap` rows), so files written by `unienv` open here and ours open there.
"""
from __future__ import annotations

from typing import Any, Union

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ModuleNotFoundError(
        "unienv_data.storages.pytorch needs PyTorch; install the extra: pip install 'unienv-storage[torch]'"
    ) from exc

from unienv_data.base.registry import register_storage

from ._array_storage import ArrayStorageBase


@register_storage
class PytorchTensorStorage(
    ArrayStorageBase[torch.Tensor, torch.Tensor, Union[torch.device, str], torch.dtype, torch.Generator],
):
    """A `(capacity, *shape)` tensor of a torch Box / Binary space, on the CPU.

    `create(space, *, capacity, is_memmap=None, cache_path=None, multiprocessing=False, memmap_existok=True)`:
    memory-mapped when `cache_path` is given, else in RAM (in shared memory with `multiprocessing=True`);
    `capacity=None` grows on demand. `load_from(path, space, *, capacity=None, read_only=True, is_memmap=None,
    multiprocessing=False)` takes the capacity from the file. Reads return new tensors; index with ints (also
    NumPy integers and 0-d tensors), slices, Ellipsis, integer tensors / arrays / lists and boolean masks.
    Pickles by file name (memmap, shared memory) so worker processes map the same rows.
    """

    _backend_name = "pytorch"

    def _wrap(self, arr: np.ndarray) -> Any:
        t = torch.from_numpy(arr)
        if self.single_instance_space.dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t
