"""ImageStorage: the shared SpaceStorage contract with exact formats (PNG, lossless WebP), plus lossy JPEG / WebP
round trips, missing and damaged files, reference-written directories and dumps into another directory."""
from __future__ import annotations

import json
import os
import pickle
from typing import Any, Optional

import numpy as np
import pytest

pytest.importorskip("PIL")

from unienv_data.testing.conformance import StorageConformance  # noqa: E402

from unienv_data.base.errors import StorageFormatError, StorageNotFoundError, StorageStateError  # noqa: E402
from unienv_data.storages.image_storage import ImageStorage  # noqa: E402
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BinarySpace, BoxSpace, DictSpace  # noqa: E402

torch = pytest.importorskip("torch")
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402


# ---------------------------------------------------------------------------------------------------- conformance
class _ImageConformance(StorageConformance):
    supports_growable = True
    create_kwargs: dict = {"format": "PNG"}

    def create(self, tmp_path: Any, capacity: Optional[int]) -> Any:
        return ImageStorage.create(self.space, capacity=capacity, cache_path=os.path.join(os.fspath(tmp_path), "images"),
                                   **self.create_kwargs)

    def load(self, path: Any, read_only: bool) -> Any:
        return ImageStorage.load_from(path, self.space, read_only=read_only)


class TestImagePNGConformance(_ImageConformance):
    def make_space(self) -> BoxSpace:
        return BoxSpace(NB, 0, 255, np.uint8, shape=(8, 8, 3))


class TestImageWebPLosslessGrayTorchConformance(_ImageConformance):
    create_kwargs = {"format": "WEBP", "lossless": True}

    def make_space(self) -> BoxSpace:
        return BoxSpace(TB, 0, 200, torch.uint8, shape=(6, 10))



# ---------------------------------------------------------------------------------------------------- helpers
H, W = 16, 12
RGB = BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 3))
GRAY = BoxSpace(NB, 0, 255, np.uint8, shape=(H, W))


def smooth(n: int, gray: bool = False, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    out = []
    for t in range(n):
        img = np.stack([100 + 60 * np.sin((xx + t) / 4), 120 + 50 * np.cos(yy / 3), 80 + 4 * xx + 3 * yy], -1)
        img += rng.normal(0, 2, img.shape)
        out.append(np.clip(np.round(img), 0, 255).astype(np.uint8))
    arr = np.stack(out)
    return arr[..., 1].copy() if gray else arr


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def new(tmp_path: Any, name: str = "img", space: Any = RGB, **kwargs: Any) -> ImageStorage:
    kwargs.setdefault("capacity", 10)
    return ImageStorage.create(space, cache_path=os.path.join(os.fspath(tmp_path), name), **kwargs)


def files(st: ImageStorage) -> list:
    return sorted(n for n in os.listdir(st.cache_filename) if n != "image_metadata.json")


# ---------------------------------------------------------------------------------------------------- formats
@pytest.mark.parametrize("fmt, kwargs, bound", [("JPEG", {"quality": 90}, 30), ("WEBP", {"quality": 90}, 30),
                                                ("JPEG", {"quality": 20}, 20)])
@pytest.mark.parametrize("gray", [False, True])
def test_lossy_formats_round_trip_within_psnr(tmp_path: Any, fmt: str, kwargs: dict, bound: float, gray: bool) -> None:
    st = new(tmp_path, format=fmt, space=GRAY if gray else RGB, **kwargs)
    assert not st.is_exact and st.format == fmt
    imgs = smooth(6, gray)
    st.set(slice(0, 6), imgs)
    got = st.get(slice(0, 6))
    assert got.shape == imgs.shape and got.dtype == np.uint8
    assert psnr(got, imgs) >= bound
    assert files(st)[0].endswith("." + fmt.lower())


@pytest.mark.parametrize("fmt, kwargs", [("PNG", {}), ("WEBP", {"lossless": True})])
def test_exact_formats_are_exact(tmp_path: Any, fmt: str, kwargs: dict) -> None:
    imgs = np.random.default_rng(0).integers(0, 256, (5, H, W, 3), dtype=np.uint8)
    st = new(tmp_path, format=fmt, **kwargs)
    assert st.is_exact
    st.set([4, 0, 2, 1, 3], imgs)
    np.testing.assert_array_equal(st.get([4, 0, 2, 1, 3]), imgs)


def test_bad_arguments_and_spaces(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="JPEG is lossy"):
        new(tmp_path, format="JPEG", lossless=True)
    with pytest.raises(ValueError, match="format"):
        new(tmp_path, format="GIF")
    with pytest.raises(ValueError, match="quality"):
        new(tmp_path, format="JPEG", quality=101)
    with pytest.raises(ValueError, match="cache_path is required"):
        ImageStorage.create(RGB, capacity=3)
    with pytest.raises(ValueError, match="one process"):
        new(tmp_path, multiprocessing=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        new(tmp_path, colour="red")
    for space, err in [(BoxSpace(NB, 0.0, 1.0, np.float32, shape=(H, W, 3)), ValueError),
                       (BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 4)), ValueError),
                       (BinarySpace(NB, (H, W)), TypeError), (DictSpace(NB, {"a": RGB}), TypeError)]:
        with pytest.raises(err, match=r"uint8 BoxSpace of shape \(H, W, 3\)"):
            new(tmp_path, space=space)
    st = new(tmp_path, "ok")
    with pytest.raises(ValueError, match=r"image: expected shape \(16, 12, 3\), got \(12, 16, 3\)"):
        st.set(0, np.zeros((W, H, 3), np.uint8))
    with pytest.raises(ValueError, match="image"):
        st.set(0, np.full((H, W, 3), 0.5, np.float32))
    assert files(st) == []


# ---------------------------------------------------------------------------------------------------- files
def test_unwritten_rows_are_zero_but_a_missing_file_is_an_error(tmp_path: Any) -> None:
    st = new(tmp_path)
    imgs = smooth(3)
    st.set([1, 5, 7], imgs)
    np.testing.assert_array_equal(st.get(0), np.zeros((H, W, 3), np.uint8))
    st.close()
    os.unlink(os.path.join(st.cache_filename, "5.png"))
    back = ImageStorage.load_from(st.cache_filename, RGB)
    np.testing.assert_array_equal(back.get(1), imgs[0])
    np.testing.assert_array_equal(back.get(2), np.zeros((H, W, 3), np.uint8))
    with pytest.raises(StorageNotFoundError, match=r"5\.png for row 5 is missing"):
        back.get(5)
    with pytest.raises(StorageNotFoundError, match=r"5\.png"):
        back.get([1, 5])


def test_truncated_or_foreign_files_are_errors(tmp_path: Any) -> None:
    st = new(tmp_path)
    st.set(slice(0, 3), smooth(3))
    d = st.cache_filename
    path = os.path.join(d, "1.png")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(StorageFormatError, match=r"1\.png for row 1 is damaged or truncated"):
        st.get(1)
    from PIL import Image
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(os.path.join(d, "2.png"))
    with pytest.raises(StorageFormatError, match=r"2\.png \(row 2\) is 4x4, expected 12x16"):
        st.get(2)


def test_dumps_to_another_directory_and_again(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=None)
    imgs = smooth(6)
    st.extend_length(6)
    st.set(slice(0, 6), imgs)
    target = os.path.join(os.fspath(tmp_path), "copy")
    st.dumps(target)
    back = ImageStorage.load_from(target, RGB)
    np.testing.assert_array_equal(back.get(Ellipsis), imgs)
    st.set(0, imgs[5])
    np.testing.assert_array_equal(back.get(0), imgs[0])  # the hard-linked copy does not see the source's write
    st.shrink_length(2)
    st.dumps(target)
    back2 = ImageStorage.load_from(target, RGB)
    assert len(back2) == 4
    np.testing.assert_array_equal(back2.get(Ellipsis), np.concatenate([imgs[5:6], imgs[1:4]]))
    assert sorted(os.listdir(target)) == ["0.png", "1.png", "2.png", "3.png", "image_metadata.json"]


def test_open_segment_rows_are_committed_at_segment_end(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=None)
    imgs = smooth(4)
    st.mark_segment_start(0)
    for im in imgs[:2]:
        st.append(im)
    np.testing.assert_array_equal(st.get(1), imgs[1])  # readable at once, like an array storage
    crashed = ImageStorage.load_from(st.cache_filename, RGB)  # what a crash now would leave
    assert len(crashed) == 0 and crashed.episode_segments() == []
    st.mark_segment_end()
    back = ImageStorage.load_from(st.cache_filename, RGB)
    assert back.episode_segments() == [(0, 1)]
    np.testing.assert_array_equal(back.get(Ellipsis), imgs[:2])
    open(os.path.join(st.cache_filename, ".active-deadbeef.tmp.png"), "wb").write(b"half")
    np.testing.assert_array_equal(ImageStorage.load_from(st.cache_filename, RGB).get(Ellipsis), imgs[:2])


def test_batch_reads_keep_the_callers_order(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=20)
    imgs = np.random.default_rng(3).integers(0, 256, (20, H, W, 3), dtype=np.uint8)
    st.set(Ellipsis, imgs)
    idx = np.random.default_rng(4).integers(0, 20, 50)
    np.testing.assert_array_equal(st.get(idx), imgs[idx])


def test_reference_written_directory_loads(tmp_path: Any) -> None:
    from PIL import Image
    d = os.path.join(os.fspath(tmp_path), "ref")
    os.makedirs(d)
    imgs = smooth(3)
    for i, im in zip((0, 2, 3), imgs):
        Image.fromarray(im).save(os.path.join(d, f"{i}.png"))
    json.dump({"storage_type": "ImageStorage", "format": "PNG", "quality": 75, "capacity": 5, "length": 5},
              open(os.path.join(d, "image_metadata.json"), "w"))
    st = ImageStorage.load_from(d, RGB)
    np.testing.assert_array_equal(st.get([0, 2, 3]), imgs)
    np.testing.assert_array_equal(st.get(1), np.zeros((H, W, 3), np.uint8))


def test_pickled_copy_is_read_only(tmp_path: Any) -> None:
    st = new(tmp_path)
    imgs = smooth(2)
    st.set([3, 4], imgs)
    clone = pickle.loads(pickle.dumps(st))
    assert clone.is_multiprocessing_safe and not st.is_multiprocessing_safe
    np.testing.assert_array_equal(clone.get([4, 3]), imgs[::-1])
    with pytest.raises(StorageStateError, match="read-only"):
        clone.set(0, imgs[0])


def test_load_checks_space_and_capacity(tmp_path: Any) -> None:
    st = new(tmp_path, capacity=4)
    st.close()
    with pytest.raises(ValueError, match="capacity 4"):
        ImageStorage.load_from(st.cache_filename, RGB, capacity=3)
    with pytest.raises(ValueError, match=r"shape \[16, 12, 3\]"):
        ImageStorage.load_from(st.cache_filename, GRAY)
    meta_path = os.path.join(st.cache_filename, "image_metadata.json")
    meta = json.load(open(meta_path))
    meta["written"] = [[3, 5]]
    json.dump(meta, open(meta_path, "w"))
    with pytest.raises(StorageFormatError, match="written"):
        ImageStorage.load_from(st.cache_filename, RGB)


@pytest.mark.parametrize("fmt, kwargs", [("PNG", {}), ("WEBP", {"lossless": True}), ("JPEG", {"quality": 95})])
def test_gray_images_with_a_channel_axis(tmp_path: Any, fmt: str, kwargs: dict) -> None:
    space = BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 1))
    imgs = smooth(3, gray=True)[..., None]
    st = new(tmp_path, space=space, format=fmt, **kwargs)
    st.set(slice(0, 3), imgs)
    got = st.get(slice(0, 3))
    assert got.shape == (3, H, W, 1) and st.get(0).shape == (H, W, 1)
    assert psnr(got, imgs) >= (float("inf") if st.is_exact else 30)


@pytest.mark.parametrize("how", ["append", "writer"])
def test_overwritten_episodes_leave_the_metadata_before_their_files_change(tmp_path: Any, how: str) -> None:
    """What a crash leaves on disk (read by a second opener while the writer is mid-episode): an episode whose row
    already holds a frame of the new, uncommitted one is no longer listed."""
    d = os.path.join(tmp_path, "img")
    st = ImageStorage.create(RGB, cache_path=d, capacity=4)
    st.mark_segment_start(0)
    for v in (10, 20, 30, 40):
        st.append(np.full((H, W, 3), v, np.uint8))
    st.mark_segment_end()
    assert ImageStorage.load_from(d, RGB).episode_segments() == [(0, 3)]
    if how == "append":
        st.mark_segment_start(0)
        st.append(np.full((H, W, 3), 99, np.uint8))
    else:
        w = st.open_segment_writer()
        w.append(np.full((H, W, 3), 99, np.uint8))
        w.commit(0)
    seen = ImageStorage.load_from(d, RGB)
    assert int(seen.get(0)[0, 0, 0]) == 99
    assert (0, 3) not in (seen.episode_segments() or [])
    assert seen.has_persistent_segments()
    seen.close()
    st.close()
