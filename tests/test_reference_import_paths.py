"""The reference's module names for batches, the recorder and the env contract import the very classes that live
under this project's module names (aliases, not copies)."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from _third_party import has_venv, venv_python

import unienv_data.batches as batches

ALIASES = [
    ("combined_batch", "CombinedBatch"),
    ("framestack_batch", "FrameStackedBatch"),
    ("slicestack_batch", "SliceStackedBatch"),
    ("subindex_batch", "SubIndexedBatch"),
    ("subitem_batch", "SubItemBatch"),
    ("transformations", "TransformedBatch"),
]


@pytest.mark.parametrize("module, name", ALIASES)
def test_batch_module_alias_is_the_same_class(module: str, name: str) -> None:
    mod = importlib.import_module(f"unienv_data.batches.{module}")
    assert getattr(mod, name) is getattr(batches, name)
    assert mod.__all__ == [name]


def test_recorder_and_env_contract_import_without_gymnasium() -> None:
    code = ("import sys, unienv_data, unienv_interface.env_base, unienv_data.replay_buffer.collection_wrapper, "
            "unienv_data.transformations.image_compress, unienv_data.storages.transformation\n"
            "from unienv_data.replay_buffer import ReplayBufferCollectionWrapper\n"
            "bad = [m for m in ('gymnasium', 'PIL', 'torch', 'jax') if m in sys.modules]\n"
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("module", ["unienv_interface.wrapper.gym_compat", "unienv_interface.space.space_utils.gym_utils"])
def test_gym_modules_without_gymnasium_name_the_extra(module: str) -> None:
    code = ("import sys\nsys.modules['gymnasium'] = None\n"
            "try:\n"
            f"    import {module}\n"
            "except ImportError as exc:\n"
            "    print('ImportError:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ImportError:" in proc.stdout and "unienv-storage[gym]" in proc.stdout


_SIGNATURES = r"""
import inspect, json
from unienv_data.replay_buffer.collection_wrapper import ReplayBufferCollectionWrapper as R
from unienv_data.transformations.image_compress import ImageCompressTransformation as I, ImageDecompressTransformation as D
from unienv_interface.env_base import Env, Wrapper
out = {}
for name, f in [("R.__init__", R.__init__), ("R.shared", R.shared), ("R.per_env", R.per_env),
                ("R.set_replay_buffers", R.set_replay_buffers), ("I.__init__", I.__init__), ("D.__init__", D.__init__),
                ("Env.reset", Env.reset), ("Env.step", Env.step), ("Wrapper.__init__", Wrapper.__init__),
                ("Wrapper.reset", Wrapper.reset)]:
    out[name] = [(p.name, None if p.default is p.empty else repr(p.default), p.kind.name)
                 for p in inspect.signature(f).parameters.values()]
print(json.dumps(out))
"""


@pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"), reason="the reference venv is not built")
def test_signatures_match_the_reference(tmp_path: Any) -> None:
    ref = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")), "-c", _SIGNATURES],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert ref.returncode == 0, ref.stderr[-3000:]
    ours = subprocess.run([sys.executable, "-c", _SIGNATURES], capture_output=True, text=True, timeout=300)
    assert ours.returncode == 0, ours.stderr[-3000:]
    assert json.loads(ours.stdout) == json.loads(ref.stdout)
