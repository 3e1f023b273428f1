"""`ImageCompressTransformation`: JPEG quality on natural-looking frames, the quality ladder and its floor, the
round trip through a TransformedStorage (memory-mapped, dumped and reloaded), JSON, and byte-level
compatibility with the reference (it decodes our rows, we decode its rows, same budgets)."""
from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import numpy as np
import pytest

from _third_party import has_venv, require_module, venv_python

require_module("PIL", "video")

from unienv_data.storages.numpy_memmap import NumpyMemmapStorage  # noqa: E402
from unienv_data.storages.transformation import TransformedStorage  # noqa: E402
from unienv_data.transformations.image_compress import (ImageCompressTransformation,  # noqa: E402
                                                        ImageDecompressTransformation, default_compression_ratio)
from unienv_interface.backends import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.space import BoxSpace  # noqa: E402
from unienv_interface.transformations import json_to_transformation, transformation_to_json  # noqa: E402

H, W = 72, 96


def natural_frame(seed: int, h: int = H, w: int = W) -> np.ndarray:
    """A camera-like frame: smooth illumination gradients, a few soft-edged objects and mild fine texture
    (deterministic, no noise)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([90 + 80 * np.sin(xx / (23 + seed) + seed), 110 + 70 * np.cos(yy / 19 - seed / 3),
                     70 + 1.2 * xx + 0.6 * yy], axis=-1)
    for k in range(3):
        cy, cx, r = (h * (0.25 + 0.25 * k), w * (0.3 + 0.2 * ((k + seed) % 3)), 8 + 3 * k)
        blob = 1.0 / (1.0 + np.exp(np.hypot(yy - cy, xx - cx) - r))          # a soft disc
        base += blob[..., None] * np.array([60.0 - 40 * k, 30.0 * k, -50.0 + 30 * k])
    base += (5 * np.sin(xx * 0.8 + yy * 0.3) * np.cos(yy * 0.6))[..., None]  # surface texture
    return np.clip(np.rint(base), 0, 255).astype(np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


IMAGE_SPACE = BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 3))
FRAMES = np.stack([natural_frame(s) for s in range(6)])


def test_quality_90_reaches_35_db_on_natural_frames() -> None:
    t = ImageCompressTransformation(init_quality=90, max_size_bytes=H * W * 3)
    for frame in FRAMES:
        encoded, quality = t.encode_to_size(frame, t.budget_bytes(IMAGE_SPACE))
        assert quality == 90                       # it fit at the requested quality: no step down
        assert len(encoded) < frame.nbytes / 3     # and it is compressed
    rows = t.transform(IMAGE_SPACE, FRAMES)
    back = t.direction_inverse(IMAGE_SPACE).transform(t.get_target_space_from_source(IMAGE_SPACE), rows)
    scores = [psnr(a, b) for a, b in zip(FRAMES, back)]
    assert min(scores) >= 35.0, scores


def test_default_budget_and_layout() -> None:
    t = ImageCompressTransformation()      # quality 70, the conservative JPEG ratio and a 1024-byte header allowance
    assert t.compression_ratio == default_compression_ratio("JPEG", 70) == 18
    assert t.budget_bytes(IMAGE_SPACE) == H * W * 3 // 18 + 1 + 1024
    target = t.get_target_space_from_source(BoxSpace(NB, 0, 255, np.uint8, shape=(2, H, W, 3)))
    assert target.shape == (2, t.budget_bytes(IMAGE_SPACE)) and target.dtype == np.uint8
    rows = np.asarray(t.transform(IMAGE_SPACE, FRAMES[0]))
    assert rows[:2].tolist() == [0xFF, 0xD8]                    # the JPEG file starts at byte 0 ...
    end = int(np.flatnonzero(rows)[-1]) + 1
    assert rows[end - 2:end].tolist() == [0xFF, 0xD9] and not rows[end:].any()   # ... and is zero-padded
    gray = ImageCompressTransformation(last_channel=False, init_quality=80)
    gspace = BoxSpace(NB, 0, 255, np.uint8, shape=(H, W))
    g = FRAMES[0][..., 1]
    back = gray.direction_inverse(gspace).transform(gray.get_target_space_from_source(gspace), gray.transform(gspace, g))
    assert back.shape == (H, W) and psnr(back, g) > 30


def test_quality_steps_down_then_fails_at_the_floor() -> None:
    frame = FRAMES[1]
    t = ImageCompressTransformation(init_quality=95, max_size_bytes=10 ** 6)
    sizes = {q: len(ImageCompressTransformation(init_quality=q, max_size_bytes=10 ** 6).encode_to_size(frame, 10 ** 6)[0])
             for q in (95, 85, 75, 65)}
    budget = (sizes[85] + sizes[75]) // 2           # too small for 95 and 85, enough for 75
    encoded, quality = t.encode_to_size(frame, budget)
    assert quality == 75 and len(encoded) <= budget
    with pytest.raises(ValueError) as err:
        t.encode_to_size(frame, 300)
    msg = str(err.value)
    assert "even at quality 20" in msg and "budget is 300 bytes" in msg and f"({H}, {W}, 3)" in msg
    needed = int(msg.split(" needs ")[1].split(" bytes")[0])
    assert needed > 300
    small = ImageCompressTransformation(init_quality=90, max_size_bytes=300)
    with pytest.raises(ValueError, match="budget is 300 bytes"):
        small.transform(IMAGE_SPACE, FRAMES[:2])


@pytest.mark.parametrize("capacity", [8, None])
def test_round_trip_through_a_transformed_storage_dump_and_reload(tmp_path: Any, capacity: Any) -> None:
    t = ImageCompressTransformation(init_quality=90)
    path = os.fspath(tmp_path / "frames")
    st = TransformedStorage.create(IMAGE_SPACE, NumpyMemmapStorage, data_transformation=t, capacity=capacity,
                                   cache_path=path)
    assert st.inner_storage.single_instance_space.shape == (t.budget_bytes(IMAGE_SPACE),)
    if capacity is None:
        st.extend_length(len(FRAMES))
    st.set(slice(0, len(FRAMES)), FRAMES)
    first = np.asarray(st.get(slice(0, len(FRAMES))))
    assert min(psnr(a, b) for a, b in zip(first, FRAMES)) >= 35.0
    st.dumps(path)
    st.close()
    again = TransformedStorage.load_from(path, IMAGE_SPACE)
    assert isinstance(again.data_transformation, ImageCompressTransformation)
    assert again.data_transformation == t
    assert np.array_equal(np.asarray(again.get(slice(0, len(FRAMES)))), first)   # the same stored bytes
    assert np.array_equal(np.asarray(again.get(2)), first[2])
    again.close()


def test_torch_images_through_a_tensor_storage(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    from unienv_data.storages.pytorch import PytorchTensorStorage
    from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB
    space = BoxSpace(TB, 0, 255, torch.uint8, shape=(H, W, 3))
    path = os.fspath(tmp_path / "torch_frames")
    st = TransformedStorage.create(space, PytorchTensorStorage, capacity=4, cache_path=path,
                                   data_transformation=ImageCompressTransformation(init_quality=90))
    st.set(slice(0, 3), torch.from_numpy(FRAMES[:3]))
    got = st.get(slice(0, 3))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.uint8
    assert min(psnr(a, b) for a, b in zip(got.numpy(), FRAMES[:3])) >= 35.0
    st.dumps(path)
    st.close()
    again = TransformedStorage.load_from(path, space)
    assert torch.equal(again.get(slice(0, 3)), got)
    again.close()


def test_unwritten_rows_read_back_black_and_garbage_is_an_error() -> None:
    dec = ImageDecompressTransformation(4, 5, 3)
    rows = BoxSpace(NB, 0, 255, np.uint8, shape=(64,))
    assert not np.asarray(dec.transform(rows, np.zeros(64, np.uint8))).any()
    garbage = np.arange(64, dtype=np.uint8)
    with pytest.raises(ValueError, match="row 0 does not hold a decodable image"):
        dec.transform(rows, garbage)


def test_json_inverse_and_argument_errors() -> None:
    t = ImageCompressTransformation(init_quality=85, compression_ratio=6, mode="RGB", header_bytes=512)
    js = transformation_to_json(t)
    assert js["type"] == "unienv_data.transformations.image_compress.ImageCompressTransformation"
    assert json_to_transformation(json.loads(json.dumps(js))) == t
    inv = t.direct_inverse(IMAGE_SPACE)
    assert json_to_transformation(transformation_to_json(inv)) == inv
    back = inv.direction_inverse(t.get_target_space_from_source(IMAGE_SPACE))
    assert back.max_size_bytes == t.budget_bytes(IMAGE_SPACE)
    with pytest.raises(ValueError, match="not both"):
        ImageCompressTransformation(max_size_bytes=100, compression_ratio=4)
    with pytest.raises(ValueError, match="init_quality"):
        ImageCompressTransformation(init_quality=0)
    with pytest.raises(ValueError, match="no default compression ratio for format 'PNG'"):
        ImageCompressTransformation(format="PNG")
    with pytest.raises(ValueError, match="needs the image space"):
        t.direct_inverse()
    with pytest.raises(TypeError, match="needs uint8 images"):
        t.get_target_space_from_source(BoxSpace(NB, 0.0, 1.0, np.float32, shape=(H, W, 3)))
    with pytest.raises(ValueError, match=r"\(\.\.\., H, W, 1 or 3\)"):
        t.get_target_space_from_source(BoxSpace(NB, 0, 255, np.uint8, shape=(H, W, 4)))
    with pytest.raises(ValueError, match=r"expected images of shape \(\.\.\., 72, 96, 3\), got \(72, 96\)"):
        t.transform(IMAGE_SPACE, FRAMES[0][..., 0])


_REFERENCE_SCRIPT = r"""
import json, sys
import numpy as np
from unienv_interface.backends.numpy import NumpyComputeBackend as B
from unienv_interface.space import BoxSpace
from unienv_data.transformations.image_compress import ImageCompressTransformation, get_jpeg_compression_ratio
req = json.loads(sys.argv[1])
images = np.load(req["images"])
ours = np.load(req["ours"])
space = BoxSpace(B, 0, 255, np.uint8, shape=images.shape[1:])
t = ImageCompressTransformation(init_quality=req["quality"])
target = t.get_target_space_from_source(space)
np.save(req["theirs"], np.asarray(t.transform(space, images)))
np.save(req["decoded"], np.asarray(t.direction_inverse(space).transform(target, ours)))
print(json.dumps({"budget": int(target.shape[-1]), "ratios": [int(get_jpeg_compression_ratio(q)) for q in range(1, 101)]}))
"""


@pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"), reason="the reference venv is not built")
def test_reference_reads_our_rows_and_we_read_its_rows(tmp_path: Any) -> None:
    t = ImageCompressTransformation(init_quality=90)
    ours = np.asarray(t.transform(IMAGE_SPACE, FRAMES))
    files = {k: os.fspath(tmp_path / f"{k}.npy") for k in ("images", "ours", "theirs", "decoded")}
    np.save(files["images"], FRAMES)
    np.save(files["ours"], ours)
    proc = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")), "-c", _REFERENCE_SCRIPT,
                           json.dumps({**files, "quality": 90})], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["budget"] == t.budget_bytes(IMAGE_SPACE)                 # the same stored row width
    assert report["ratios"] == [default_compression_ratio("JPEG", q) for q in range(1, 101)]
    ours_decoded = np.asarray(t.direction_inverse(IMAGE_SPACE).transform(t.get_target_space_from_source(IMAGE_SPACE), ours))
    ref_decoded = np.load(files["decoded"])
    assert np.abs(ref_decoded.astype(int) - ours_decoded.astype(int)).max() <= 1   # it reads our rows
    theirs = np.load(files["theirs"])
    assert theirs.shape == ours.shape
    theirs_decoded = np.asarray(
        t.direction_inverse(IMAGE_SPACE).transform(t.get_target_space_from_source(IMAGE_SPACE), theirs))
    assert min(psnr(a, b) for a, b in zip(theirs_decoded, FRAMES)) >= 35.0     # we read its rows
