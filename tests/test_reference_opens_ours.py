"""Datasets written by this project open in the reference (unienv==0.0.1b16) with identical values.

Five kinds, each a ReplayBuffer directory (so the reference learns space, storage class and capacity from the
files alone): a FlattenedStorage over a memory-mapped PytorchTensorStorage, a ring that wrapped with
`maintain_segment_metadata=True`, a DictStorage with an image key and a flat residual, a growable HDF5 buffer,
and an FFV1 VideoStorage with segments. The reference reads them in one subprocess
(tests/fixtures/reference_open_buffers.py); every row it reads must equal ours, and so must the segments where
both sides keep the same list (the maintained ring, the video files).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

from _third_party import has_venv, require_module, venv_python

torch = pytest.importorskip("torch")

from unienv_data.replay_buffer import ReplayBuffer  # noqa: E402
from unienv_data.storages.dict_storage import DictStorage  # noqa: E402
from unienv_data.storages.flattened import FlattenedStorage  # noqa: E402
from unienv_data.storages.pytorch import PytorchTensorStorage  # noqa: E402
from unienv_interface.backends.numpy import NumpyComputeBackend as NB  # noqa: E402
from unienv_interface.backends.pytorch import PyTorchComputeBackend as TB  # noqa: E402
from unienv_interface.space import BoxSpace, DictSpace  # noqa: E402

SCRIPT = Path(__file__).parent / "fixtures" / "reference_open_buffers.py"

needs_reference = pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"),
                                     reason="reference venv (unienv==0.0.1b16) not found")


def reference_open(requests: List[Dict[str, Any]], tmp: Path) -> List[Dict[str, Any]]:
    # without PYTHONPATH: a PYTHONPATH pointing at this project's src/ would make the "reference" import our package
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")), str(SCRIPT), json.dumps(requests)],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp), env=env)
    assert proc.returncode == 0, f"the reference opener failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: lists(v) for k, v in value.items()}
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value).tolist()


def ours(rb: ReplayBuffer) -> Dict[str, Any]:
    segs = rb.get_segments()
    return {"len": len(rb), "capacity": rb.capacity, "offset": rb.offset,
            "rows": [lists(rb.get_at(i)) for i in range(len(rb))],
            "segments": None if segs is None else [list(s) for s in segs]}


def flat_space() -> DictSpace:
    return DictSpace(TB, {"pos": BoxSpace(TB, -5.0, 5.0, torch.float32, shape=(3,)),
                          "step": BoxSpace(TB, 0, 1000, torch.int32, shape=()),
                          "done": BoxSpace(TB, 0, 1, torch.uint8, shape=())})


def flat_row(i: int) -> Dict[str, Any]:
    return {"pos": torch.tensor([i / 8, -i / 4, 0.5], dtype=torch.float32),
            "step": torch.tensor(i, dtype=torch.int32), "done": torch.tensor(i % 3 == 2, dtype=torch.uint8)}


def build(tmp: Path) -> List[Dict[str, Any]]:
    cases = []

    # 1. FlattenedStorage over a memory-mapped PytorchTensorStorage; episodes wrap a ring of 6
    d = tmp / "flat_memmap"
    rb = ReplayBuffer.create(FlattenedStorage, flat_space(), inner_storage_cls=PytorchTensorStorage,
                             cache_path=d, capacity=6, is_memmap=True)
    for ep in ([0, 1, 2], [3, 4], [5, 6, 7]):
        for i in ep:
            rb.append(flat_row(i))
        rb.mark_segment_end()
    rb.dumps(d)
    cases.append({"path": str(d), "backend": "pytorch", "want": ours(rb), "segments": False})
    rb.close()

    # 2. a ring with maintain_segment_metadata=True: extends and episodes, wrapped (the oldest clipped)
    d = tmp / "ring"
    rb = ReplayBuffer.create(PytorchTensorStorage, BoxSpace(TB, -100.0, 100.0, torch.float32, shape=(2,)),
                             cache_path=d, capacity=5, is_memmap=True, maintain_segment_metadata=True)
    rb.extend(torch.arange(6, dtype=torch.float32).reshape(3, 2))
    for i in range(3):
        rb.append(torch.full((2,), 10.0 + i))
    rb.mark_segment_end()
    rb.extend(torch.full((1, 2), 20.0))
    rb.dumps(d)
    cases.append({"path": str(d), "backend": "pytorch", "want": ours(rb), "segments": True})
    rb.close()

    # 3. a DictStorage: an image key in its own tensor storage, the rest flattened into one row
    d = tmp / "dict_image"
    space = DictSpace(TB, {"image": BoxSpace(TB, 0, 255, torch.uint8, shape=(4, 4, 3)),
                           "state": BoxSpace(TB, -1.0, 1.0, torch.float32, shape=(2,)),
                           "reward": BoxSpace(TB, -10.0, 10.0, torch.float32, shape=())})
    rb = ReplayBuffer.create(DictStorage, space, {"image": PytorchTensorStorage, "*": FlattenedStorage},
                             cache_path=d, capacity=4, is_memmap=True,
                             key_kwargs={"*": {"inner_storage_cls": PytorchTensorStorage}})
    for i in range(6):
        rb.append({"image": torch.full((4, 4, 3), 40 * i, dtype=torch.uint8),
                   "state": torch.tensor([i / 8, -i / 8]), "reward": torch.tensor(float(i))})
    rb.mark_segment_end()
    rb.dumps(d)
    cases.append({"path": str(d), "backend": "pytorch", "want": ours(rb), "segments": False})
    rb.close()

    # 4. a growable HDF5 buffer
    require_module("h5py", "hdf5")
    from unienv_data.storages.hdf5 import HDF5Storage
    d = tmp / "hdf5_growable"
    space = DictSpace(NB, {"obs": BoxSpace(NB, -4.0, 4.0, np.float32, shape=(2,)),
                           "act": BoxSpace(NB, -1, 1, np.int64, shape=())})
    rb = ReplayBuffer.create(HDF5Storage, space, cache_path=d, capacity=None)
    for i in range(5):
        rb.append({"obs": np.array([i / 4, -i / 4], np.float32), "act": np.int64(i % 3 - 1)})
        if i == 1:
            rb.mark_segment_end()
    rb.mark_segment_end()
    rb.extend({"obs": np.zeros((2, 2), np.float32), "act": np.zeros(2, np.int64)})
    rb.dumps(d)
    cases.append({"path": str(d), "backend": "numpy", "want": ours(rb), "segments": False})
    rb.close()

    # 5. an FFV1 VideoStorage filled by segment writers (committed out of order) and appends
    require_module("av", "video")
    from unienv_data.storages.video_storage import VideoStorage
    d = tmp / "video"
    rb = ReplayBuffer.create(VideoStorage, BoxSpace(NB, 0, 255, np.uint8, shape=(8, 8, 3)), cache_path=d,
                             capacity=None, codec="ffv1", file_ext="mkv")
    frame = lambda v: np.full((8, 8, 3), v, np.uint8)  # noqa: E731
    w1, w2 = rb.open_segment_writer(), rb.open_segment_writer()
    for v in (10, 20, 30):
        w1.append(frame(v))
    for v in (40, 50):
        w2.append(frame(v))
    rb.commit_segment(w2)
    rb.commit_segment(w1)
    for v in (60, 70):
        rb.append(frame(v))
    rb.mark_segment_end()
    rb.dumps(d)
    cases.append({"path": str(d), "backend": "numpy", "want": ours(rb), "segments": True})
    rb.close()
    return cases


@needs_reference
@pytest.mark.filterwarnings("ignore::unienv_data.storages.flattened.FlattenPromotionWarning")
def test_reference_opens_five_dataset_kinds_written_here(tmp_path: Path) -> None:
    cases = build(tmp_path)
    got = reference_open([{"path": c["path"], "backend": c["backend"]} for c in cases], tmp_path)
    assert len(got) == len(cases) == 5
    problems = []
    for case, res in zip(cases, got):
        name = os.path.basename(case["path"])
        if "error" in res:
            problems.append(f"{name}: the reference failed: {res['error']}\n{res['trace'][-1500:]}")
            continue
        want = case["want"]
        for key in ("len", "capacity", "offset", "rows") + (("segments",) if case["segments"] else ()):
            if json.dumps(res[key], sort_keys=True) != json.dumps(want[key], sort_keys=True):
                problems.append(f"{name}: {key} differs:\n  reference {res[key]}\n  here      {want[key]}")
    assert not problems, "\n".join(problems)
