"""The generic classes take the reference's type parameters (unienv 0.0.1b16), in its order.

Code written for the reference subscripts them at runtime, e.g. its tests define
`class DummyEnv(Env[np.ndarray, None, np.ndarray, np.ndarray, Any, Any, np.dtype, np.random.Generator])`; with a
different number of parameters that line is a TypeError at import. The counts below are the reference's; the last
test reads them from the reference itself, in its venv.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

from _third_party import has_venv, require_module, venv_python
from unienv_interface.env_base import Env

# (module, class, number of type parameters in the reference)
GENERICS: List[Tuple[str, str, int]] = [
    ("unienv_interface.env_base.env", "Env", 8),
    ("unienv_interface.env_base.wrapper", "Wrapper", 16),
    ("unienv_interface.space.space", "Space", 4),
    ("unienv_interface.space.spaces.box", "BoxSpace", 4),
    ("unienv_interface.space.spaces.binary", "BinarySpace", 4),
    ("unienv_interface.space.spaces.dict", "DictSpace", 3),
    ("unienv_interface.space.spaces.tuple", "TupleSpace", 3),
    ("unienv_interface.space.spaces.text", "TextSpace", 3),
    ("unienv_interface.space.spaces.batched", "BatchedSpace", 3),
    ("unienv_data.base.common", "BatchBase", 5),
    ("unienv_data.base.common", "BatchSampler", 10),
    ("unienv_data.base.storage", "SpaceStorage", 5),
    ("unienv_data.batches.backend_compat", "ToBackendOrDeviceBatch", 10),
    ("unienv_data.storages.backend_compat", "ToBackendOrDeviceStorage", 10),
    ("unienv_data.samplers.step_sampler", "StepSampler", 5),
    ("unienv_data.samplers.multiprocessing_sampler", "MultiprocessingSampler", 10),
    ("unienv_data.replay_buffer.replay_buffer", "ReplayBuffer", 5),
    ("unienv_data.replay_buffer.collection_wrapper", "ReplayBufferCollectionWrapper", 8),
    ("unienv_data.storages.dict_storage", "DictStorage", 4),
    ("unienv_data.storages.image_storage", "ImageStorage", 4),
    ("unienv_data.storages.npz_storage", "NPZStorage", 4),
    ("unienv_data.storages.video_storage", "VideoStorage", 4),
    ("unienv_data.storages.hdf5", "HDF5Storage", 0),
    ("unienv_data.storages.pytorch", "PytorchTensorStorage", 0),
    ("unienv_data.integrations.pytorch", "PyTorchAsUniEnvDataset", 1),
]

# classes whose module needs an optional package: (module, class, count, package, extra)
OPTIONAL_GENERICS: List[Tuple[str, str, int, str, str]] = [
    ("unienv_interface.wrapper.gym_compat", "FromGymnasiumEnv", 3, "gymnasium", "gym"),
    ("unienv_interface.wrapper.gym_compat", "ToGymnasiumEnv", 8, "gymnasium", "gym"),
]

NP_ENV_ARGS = (np.ndarray, None, np.ndarray, np.ndarray, Any, Any, np.dtype, np.random.Generator)


def _cls(module: str, name: str) -> Any:
    if module.endswith(".pytorch"):
        require_module("torch", "torch")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("module,name,count", GENERICS, ids=[g[1] for g in GENERICS])
def test_subscripting_with_the_reference_count_works(module: str, name: str, count: int) -> None:
    cls = _cls(module, name)
    assert len(getattr(cls, "__parameters__", ())) == count
    if count:
        alias = cls[tuple([Any] * count)] if count > 1 else cls[Any]
        assert alias.__origin__ is cls
        with pytest.raises(TypeError):
            cls[tuple([Any] * (count + 1))]
    else:
        with pytest.raises(TypeError):
            cls[Any]


@pytest.mark.parametrize("module,name,count,package,extra", OPTIONAL_GENERICS, ids=[g[1] for g in OPTIONAL_GENERICS])
def test_optional_classes_take_the_reference_count(module: str, name: str, count: int, package: str,
                                                    extra: str) -> None:
    require_module(package, extra)
    cls = _cls(module, name)
    assert len(cls.__parameters__) == count
    assert cls[tuple([Any] * count)].__origin__ is cls


def test_reference_style_subscripts() -> None:
    from unienv_data.base.common import BatchSampler
    from unienv_data.samplers import StepSampler
    from unienv_data.storages.dict_storage import DictStorage
    from unienv_interface.env_base import Wrapper
    from unienv_interface.space import BoxSpace, DictSpace

    np_backend = (np.ndarray, Any, np.dtype, np.random.Generator)
    env_args = tuple(type(None) if a is None else a for a in NP_ENV_ARGS)  # typing stores None as NoneType
    assert Env[NP_ENV_ARGS].__args__ == env_args
    assert Wrapper[NP_ENV_ARGS + NP_ENV_ARGS].__args__ == env_args + env_args
    assert BoxSpace[np_backend].__args__ == np_backend
    assert DictSpace[np_backend[1:]].__args__ == np_backend[1:]
    assert DictStorage[np_backend].__args__ == np_backend
    batch = (Dict[str, Any],) + np_backend
    assert StepSampler[batch].__args__ == batch
    assert BatchSampler[batch + batch].__args__ == batch + batch


class _DummyEnv(Env[np.ndarray, None, np.ndarray, np.ndarray, Any, Any, np.dtype, np.random.Generator]):
    """A subclass written the reference's way; the class statement itself is what failed before."""

    def __init__(self) -> None:
        from unienv_interface.backends import NumpyComputeBackend
        from unienv_interface.space import BoxSpace

        self.backend = NumpyComputeBackend
        self.action_space = BoxSpace(NumpyComputeBackend, -1.0, 1.0, np.float32, shape=(2,))
        self.observation_space = BoxSpace(NumpyComputeBackend, -1.0, 1.0, np.float32, shape=(3,))
        self.rng = np.random.default_rng(0)
        self.t = 0

    def step(self, action: Any) -> Any:
        self.t += 1
        return np.zeros(3, np.float32), 1.0, False, self.t >= 3, {}

    def reset(self, *, mask: Optional[Any] = None, seed: Optional[int] = None, **kwargs: Any) -> Any:
        self.t = 0
        return None, np.zeros(3, np.float32), {}


def test_subclasses_of_subscripted_classes_behave_as_before() -> None:
    from unienv_data.replay_buffer.collection_wrapper import ReplayBufferCollectionWrapper
    from unienv_interface.env_base import Wrapper

    class _Layer(Wrapper[NP_ENV_ARGS + NP_ENV_ARGS]):  # type: ignore[misc]
        pass

    env = _DummyEnv()
    assert isinstance(env, Env) and _DummyEnv.__parameters__ == ()
    layer = _Layer(env)
    assert isinstance(layer, Wrapper) and layer.unwrapped is env
    _, obs, _ = layer.reset()
    assert obs.shape == (3,)
    assert layer.step(layer.sample_action())[3] is False
    # Generic adds no base of its own: the method resolution order is the classes' own
    assert [c.__name__ for c in Wrapper.__mro__] == ["Wrapper", "Env", "ABC", "Generic", "object"]
    assert ReplayBufferCollectionWrapper[NP_ENV_ARGS].__origin__ is ReplayBufferCollectionWrapper


def _counts(names: List[Tuple[str, str]]) -> Dict[str, int]:
    """`module.class` -> number of type parameters, for the classes whose module imports (optional packages)."""
    out = {}
    for module, name in names:
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:
            continue
        out[f"{module}.{name}"] = len(getattr(cls, "__parameters__", ()))
    return out


# the same function, run by the reference's python
_COUNTS = ("import importlib, json, sys\nfrom typing import Dict, List, Tuple\n" + inspect.getsource(_counts)
           + "print(json.dumps(_counts([tuple(n) for n in json.loads(sys.argv[1])])))\n")


@pytest.mark.skipif(not has_venv("unienv", "UNIENV_REFERENCE_PYTHON"), reason="the reference venv is not built")
def test_counts_match_the_reference(tmp_path: Any) -> None:
    names = [(m, c) for m, c, _ in GENERICS] + [(m, c) for m, c, _, _, _ in OPTIONAL_GENERICS]
    ref = subprocess.run([str(venv_python("unienv", "UNIENV_REFERENCE_PYTHON")), "-c", _COUNTS, json.dumps(names)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref_counts = json.loads(ref.stdout)
    assert len(ref_counts) >= len(GENERICS) - 2  # only optional-package modules may be missing there
    ours = _counts(names)
    assert {k: ours.get(k) for k in ref_counts} == ref_counts
