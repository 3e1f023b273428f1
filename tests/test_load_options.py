"""Options the reference's callers hand to every storage they open (`CROSS_STORAGE_LOAD_OPTIONS`, e.g. the
``compressed=False`` its tests pass to every `ReplayBuffer.load_from`): a storage that does not take one drops it, a
storage that does keeps its meaning, and any other unknown option (a misspelling) is still refused."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np
import pytest

from unienv_data.base.storage import _WRAPPED_BY_BASE, CROSS_STORAGE_LOAD_OPTIONS, SpaceStorage
from unienv_data.replay_buffer import ReplayBuffer
from unienv_data.storages.dict_storage import DictStorage
from unienv_data.storages.npz_storage import NPZStorage
from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
from unienv_interface.backends import NumpyComputeBackend as NB
from unienv_interface.space import BoxSpace, DictSpace

IMG = BoxSpace(NB, 0, 255, np.uint8, shape=(4, 4))
VEC = BoxSpace(NB, -1.0, 1.0, np.float32, shape=(2,))


def _video(path: Path) -> ReplayBuffer:
    pytest.importorskip("av")
    from unienv_data.storages.video_storage import VideoStorage
    return ReplayBuffer.create(VideoStorage, IMG, cache_path=path, capacity=3, codec="ffv1", file_ext="mkv")


def _image(path: Path) -> ReplayBuffer:
    pytest.importorskip("PIL")
    from unienv_data.storages.image_storage import ImageStorage
    return ReplayBuffer.create(ImageStorage, IMG, cache_path=path, capacity=3)


def _hdf5(path: Path) -> ReplayBuffer:
    pytest.importorskip("h5py")
    from unienv_data.storages.hdf5 import HDF5Storage
    return ReplayBuffer.create(HDF5Storage, VEC, cache_path=path, capacity=3)


def _memmap(path: Path) -> ReplayBuffer:
    return ReplayBuffer.create(NumpyMemmapStorage, VEC, cache_path=path, capacity=3)


BUILDERS: Dict[str, Callable[[Path], ReplayBuffer]] = {"video": _video, "image": _image, "hdf5": _hdf5,
                                                        "memmap": _memmap}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_reference_cross_options_are_dropped_where_meaningless(tmp_path: Path, kind: str) -> None:
    rb = BUILDERS[kind](tmp_path / kind)
    value = np.full((4, 4), 9, np.uint8) if kind in ("video", "image") else np.array([0.5, -0.5], np.float32)
    rb.append(value)
    rb.mark_segment_end()
    rb.dumps(tmp_path / kind)
    rb.close()
    loaded = ReplayBuffer.load_from(tmp_path / kind, backend=NB, compressed=False)
    np.testing.assert_array_equal(loaded.get_at(0), value)
    loaded.close()
    with pytest.raises(TypeError, match="compresed"):          # a misspelling is still refused
        ReplayBuffer.load_from(tmp_path / kind, backend=NB, compresed=False)


def test_a_storage_that_takes_an_option_keeps_it(tmp_path: Path) -> None:
    """A dict storage hands `compressed` on to each child: the NPZ child uses it, the video child drops it; the
    video child still checks its own option `seek_mode`, which the NPZ child drops."""
    pytest.importorskip("av")
    from unienv_data.storages.video_storage import VideoStorage
    space = DictSpace(NB, {"img": IMG, "x": VEC})
    d = tmp_path / "dict"
    rb = ReplayBuffer.create(DictStorage, space, {"img": VideoStorage, "x": NPZStorage}, cache_path=d, capacity=None,
                             type_kwargs={VideoStorage: {"codec": "ffv1", "file_ext": "mkv"}})
    rb.append({"img": np.full((4, 4), 3, np.uint8), "x": np.zeros(2, np.float32)})
    rb.mark_segment_end()
    rb.dumps(d)
    rb.close()
    loaded = ReplayBuffer.load_from(d, backend=NB, compressed=False, seek_mode="exact")
    children = loaded.storage.storage_map
    assert children["x"].compressed is False                      # NPZ files written from now on are uncompressed
    assert children["img"].seek_mode == "exact"
    loaded.close()
    with pytest.raises(ValueError, match="seek_mode"):
        ReplayBuffer.load_from(d, backend=NB, seek_mode="sideways")


def test_every_registered_storage_applies_the_rule() -> None:
    """Each storage class's `load_from` either names a cross option or drops it (containers forward them)."""
    import inspect
    seen = 0
    stack = list(SpaceStorage.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if "load_from" not in cls.__dict__ or cls.forwards_load_options:
            continue
        fn = cls.__dict__["load_from"].__func__
        named = set(inspect.signature(getattr(fn, "__wrapped__", fn)).parameters)
        assert fn in _WRAPPED_BY_BASE or CROSS_STORAGE_LOAD_OPTIONS <= named, cls
        seen += 1
    assert seen >= 5
