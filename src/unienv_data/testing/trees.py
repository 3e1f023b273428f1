"""Value trees, leaf values and expected error types shared by the conformance class and the state machine of
`unienv_data.testing`: walking, copying, stacking and comparing nested samples of any backend; drawing valid
samples of a space and the invalid leaf values a storage must refuse."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, Type

import numpy as np
import pytest

from unienv_interface.space import BinarySpace, BoxSpace, DictSpace

try:  # torch is an optional extra; the suite also serves NumPy-only storages
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]

INDEX_ERRORS = (IndexError, TypeError)
VALUE_ERRORS = (ValueError, TypeError)
STRUCTURE_ERRORS = (KeyError, ValueError, TypeError)
STATE_ERRORS = (RuntimeError, ValueError)


# ---------------------------------------------------------------------------------------------------- helpers
def expect_error(types: Tuple[Type[BaseException], ...], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException:
    """Calls `fn` and returns the exception it raised, failing the test unless it is one of `types`.

    A bare AssertionError is always a failure (errors must survive `python -O`)."""
    names = "/".join(t.__name__ for t in types)
    try:
        fn(*args, **kwargs)
    except AssertionError as exc:
        pytest.fail(f"{getattr(fn, '__name__', fn)} raised a bare AssertionError ({exc}); expected {names}")
    except types as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - reported as a test failure with its type
        pytest.fail(f"{getattr(fn, '__name__', fn)} raised {type(exc).__name__}: {exc}; expected {names}")
    pytest.fail(f"{getattr(fn, '__name__', fn)} did not raise; expected {names}")


def is_torch(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def is_jax(x: Any) -> bool:
    """A JAX array (immutable: the copy and mutation checks do not apply to it)."""
    return type(x).__module__.split(".")[0] in ("jax", "jaxlib") and hasattr(x, "dtype")


def leaf_numpy(x: Any) -> Tuple[np.ndarray, str, str]:
    """`(values as NumPy, dtype name, library)` of one array leaf (bfloat16 values come back as float32)."""
    if is_torch(x):
        t = x.detach().cpu()
        name = str(t.dtype).replace("torch.", "")
        arr = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        return np.array(arr, copy=True), name, "torch"
    if is_jax(x):
        a = np.array(x, copy=True)
        name = a.dtype.name
        return (a.astype(np.float32) if name == "bfloat16" else a), name, "jax"
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.array(x, copy=True)
        return a, a.dtype.name, "numpy"
    raise AssertionError(f"expected an array leaf, got {type(x).__name__}: {x!r}")


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, v) for v in tree)
    return fn(tree)


def tree_leaves(tree: Any, path: Tuple[Any, ...] = ()) -> Iterator[Tuple[Tuple[Any, ...], Any]]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from tree_leaves(v, path + (k,))
    elif isinstance(tree, tuple):
        for i, v in enumerate(tree):
            yield from tree_leaves(v, path + (i,))
    else:
        yield path, tree


def tree_get(tree: Any, path: Sequence[Any]) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def tree_replace(tree: Any, path: Sequence[Any], new: Any) -> Any:
    """A copy of `tree` (containers only) with the leaf at `path` replaced by `new`."""
    if not path:
        return new
    if isinstance(tree, dict):
        out = dict(tree)
        out[path[0]] = tree_replace(tree[path[0]], path[1:], new)
        return out
    if isinstance(tree, tuple):
        items = list(tree)
        items[path[0]] = tree_replace(tree[path[0]], path[1:], new)
        return tuple(items)
    raise AssertionError(f"cannot descend into {type(tree).__name__} at {path}")


def tree_drop(tree: dict, path: Sequence[Any]) -> dict:
    """A copy of a nested dict without the key at `path`."""
    out = dict(tree)
    if len(path) == 1:
        del out[path[0]]
    else:
        out[path[0]] = tree_drop(tree[path[0]], path[1:])
    return out


def copy_tree(tree: Any) -> Any:
    return tree_map(lambda x: x.clone() if is_torch(x) else (x if is_jax(x) else np.array(x, copy=True)), tree)


def stack_tree(items: Sequence[Any]) -> Any:
    """Stacks single elements into a batch (leaf by leaf, in each leaf's own library)."""
    first = items[0]
    if isinstance(first, dict):
        return {k: stack_tree([it[k] for it in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(stack_tree([it[i] for it in items]) for i in range(len(first)))
    if is_torch(first):
        return torch.stack(list(items))
    if is_jax(first):
        import jax.numpy as jnp
        return jnp.stack(list(items))
    return np.stack([np.asarray(x) for x in items])


def zeros_like_tree(tree: Any) -> Any:
    def zeros(x: Any) -> Any:
        if is_torch(x):
            return torch.zeros_like(x)
        if is_jax(x):
            import jax.numpy as jnp
            return jnp.zeros_like(x)
        return np.zeros_like(np.asarray(x))
    return tree_map(zeros, tree)


def mutate_in_place(tree: Any) -> int:
    """Changes every writable leaf in place (booleans flipped, numbers +1); returns how many leaves changed."""
    changed = 0
    for _path, x in tree_leaves(tree):
        if is_torch(x):
            if x.dtype == torch.bool:
                x.logical_not_()
            else:
                x.add_(1)
            changed += 1
        elif isinstance(x, np.ndarray) and x.flags.writeable:
            if x.dtype == np.bool_:
                x[...] = np.logical_not(x)
            else:
                x[...] = x + np.ones((), dtype=x.dtype)
            changed += 1
    return changed


def assert_tree_equal(actual: Any, expected: Any, where: str = "value") -> None:
    """Same structure, same array library, same dtype, same shape and exactly the same values (NaN == NaN)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected a dict, got {type(actual).__name__}"
        assert set(actual) == set(expected), f"{where}: keys {sorted(map(str, actual))} != {sorted(map(str, expected))}"
        for k in expected:
            assert_tree_equal(actual[k], expected[k], f"{where}[{k!r}]")
        return
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected), f"{where}: expected a tuple of {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_tree_equal(a, e, f"{where}[{i}]")
        return
    a, a_dtype, a_lib = leaf_numpy(actual)
    e, e_dtype, e_lib = leaf_numpy(expected)
    assert a_lib == e_lib, f"{where}: got a {a_lib} array, expected {e_lib}"
    assert a_dtype == e_dtype, f"{where}: got dtype {a_dtype}, expected {e_dtype}"
    assert a.shape == e.shape, f"{where}: got shape {a.shape}, expected {e.shape}"
    if a.dtype.kind == "f":
        same = np.array_equal(a, e, equal_nan=True)
    else:
        same = np.array_equal(a, e)
    assert same, f"{where}: values differ\n got      {a.tolist()}\n expected {e.tolist()}"


def index_positions(index: Any, length: int) -> np.ndarray:
    """The positions a (valid) index addresses, as NumPy ints (the model of what storages must do)."""
    if is_torch(index):
        index = index.numpy()
    if index is Ellipsis:
        return np.arange(length)
    if isinstance(index, slice):
        return np.arange(length)[index]
    arr = np.asarray(index)
    if arr.dtype == np.bool_:
        return np.flatnonzero(arr)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.where(arr < 0, arr + length, arr).astype(np.int64)


# ---------------------------------------------------------------------------------------------------- spaces
def space_leaves(space: Any, path: Tuple[Any, ...] = ()) -> Iterator[Tuple[Tuple[Any, ...], Any]]:
    if isinstance(space, DictSpace):
        for k, s in space.spaces.items():
            yield from space_leaves(s, path + (k,))
    else:
        yield path, space


def leaf_dtype_name(space: Any) -> str:
    return str(space.backend.dtype_name(space.dtype))


_MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}


def backend_array(space: Any, values: Any, dtype_name: Optional[str] = None) -> Any:
    """`values` as an array of the space's backend, in `dtype_name` (default: the space's own dtype)."""
    name = dtype_name or leaf_dtype_name(space)
    if space.backend.simplified_name == "pytorch":
        if name == "bfloat16":
            return torch.from_numpy(np.array(values, dtype=np.float32)).to(torch.bfloat16)
        return torch.from_numpy(np.array(values, dtype=np.dtype(name)))
    if space.backend.simplified_name == "numpy":
        return np.array(values, dtype=np.dtype(name))
    if space.backend.simplified_name == "jax":
        import jax.numpy as jnp
        return jnp.asarray(np.asarray(values), dtype=jnp.dtype(name))
    raise NotImplementedError(f"no conformance value helper for backend {space.backend}")


def leaf_bounds(space: Any) -> Tuple[np.ndarray, np.ndarray]:
    """Full-shape float64 bounds of a Box leaf."""
    shape = tuple(space.shape)
    lo = np.asarray(space.low_numpy, dtype=np.float64)
    hi = np.asarray(space.high_numpy, dtype=np.float64)
    lo = lo.reshape(shape) if lo.size == math.prod(shape) else np.broadcast_to(lo, shape)
    hi = hi.reshape(shape) if hi.size == math.prod(shape) else np.broadcast_to(hi, shape)
    return lo, hi


def is_float_leaf(space: Any) -> bool:
    return isinstance(space, BoxSpace) and leaf_dtype_name(space) in _MANTISSA_BITS


def is_int_leaf(space: Any) -> bool:
    return isinstance(space, BoxSpace) and not is_float_leaf(space)


def is_bounded_float_leaf(space: Any) -> bool:
    if not is_float_leaf(space):
        return False
    lo, hi = leaf_bounds(space)
    return bool(np.isfinite(lo).any() or np.isfinite(hi).any())


def sample_leaf_numpy(space: Any, rng: np.random.Generator) -> np.ndarray:
    shape = tuple(space.shape)
    if isinstance(space, BinarySpace):
        return rng.random(shape) < 0.5
    lo, hi = leaf_bounds(space)
    if is_float_leaf(space):
        u = rng.uniform(0.05, 0.95, size=shape)
        fl, fh = np.isfinite(lo), np.isfinite(hi)
        normal = rng.normal(0.0, 3.0, size=shape)
        expo = rng.exponential(1.0, size=shape) + 0.1
        with np.errstate(invalid="ignore", over="ignore"):
            out = np.where(fl & fh, lo + u * (hi - lo), np.where(fl, lo + expo, np.where(fh, hi - expo, normal)))
        return out
    lo_c = np.maximum(lo, -1000.0)
    hi_c = np.minimum(hi, 1000.0)
    return np.floor(lo_c + rng.random(shape) * (hi_c - lo_c + 1)).clip(lo_c, hi_c).astype(np.int64)


def sample_from_space(space: Any, rng: np.random.Generator) -> Any:
    """One valid element of a Dict / Box / Binary space, in the space's backend."""
    if isinstance(space, DictSpace):
        return {k: sample_from_space(s, rng) for k, s in space.spaces.items()}
    return backend_array(space, sample_leaf_numpy(space, rng))


def invalid_leaf_values(space: Any, valid: Any) -> List[Tuple[str, Any]]:
    """`(category, bad leaf)` pairs for one leaf: each must be refused by `set` / `append` / writers."""
    out: List[Tuple[str, Any]] = [("not an array", "not an array")]
    shape = tuple(space.shape)
    n = math.prod(shape)
    base, _name, _lib = leaf_numpy(valid)
    name = leaf_dtype_name(space)
    if n > 0:
        new_shape = (1,) if shape == () else ((1, n) if len(shape) == 1 else (n,))
        out.append(("wrong shape, same element count", backend_array(space, base.reshape(new_shape), name)))
    if isinstance(space, BinarySpace):
        bad = base.astype(np.int64)
        bad.reshape(-1)[:1] = 2
        out.append(("non-boolean into binary leaf", backend_array(space, bad, "int64")))
        out.append(("fraction into binary leaf", backend_array(space, np.full(shape, 0.5), "float32")))
        return out
    lo, hi = leaf_bounds(space)
    if is_int_leaf(space):
        out.append(("fraction into int leaf", backend_array(space, np.full(shape, 0.5), "float32")))
        info = np.iinfo(np.dtype(name))
        if info.max < np.iinfo(np.int64).max:
            big = 300 if name == "uint8" else int(info.max) + 1
            bad = base.astype(np.int64)
            bad.reshape(-1)[:1] = big
            out.append(("out of the int dtype's range", backend_array(space, bad, "int64")))
        if n and hi.reshape(-1)[0] < info.max:
            bad = base.copy()
            bad.reshape(-1)[:1] = hi.reshape(-1)[0] + 1
            out.append(("out of bounds", backend_array(space, bad, name)))
        if n and lo.reshape(-1)[0] > info.min:
            bad = base.copy()
            bad.reshape(-1)[:1] = lo.reshape(-1)[0] - 1
            out.append(("out of bounds", backend_array(space, bad, name)))
        return out
    # float leaves
    if n and np.isfinite(hi.reshape(-1)[0]):
        h = hi.reshape(-1)[0]
        bad = base.astype(np.float64)
        bad.reshape(-1)[:1] = h + max(1.0, abs(h))
        out.append(("out of bounds", backend_array(space, bad, name)))
    if n and np.isfinite(lo.reshape(-1)[0]):
        low = lo.reshape(-1)[0]
        bad = base.astype(np.float64)
        bad.reshape(-1)[:1] = low - max(1.0, abs(low))
        out.append(("out of bounds", backend_array(space, bad, name)))
    if n and is_bounded_float_leaf(space):
        bad = base.astype(np.float64)
        bad.reshape(-1)[:1] = np.nan
        out.append(("NaN into bounded float leaf", backend_array(space, bad, name)))
    if n and not is_bounded_float_leaf(space):
        bad = np.zeros(shape, dtype=np.int64)
        bad.reshape(-1)[:1] = 2 ** (_MANTISSA_BITS[name] + 1) + 1
        out.append(("int not representable in the float leaf", backend_array(space, bad, "int64")))
    return out


__all__ = ["expect_error", "is_torch", "is_jax", "leaf_numpy", "tree_map", "tree_leaves", "tree_get", "tree_replace", "tree_drop", "copy_tree", "stack_tree", "zeros_like_tree", "mutate_in_place", "assert_tree_equal", "index_positions", "space_leaves", "leaf_dtype_name", "backend_array", "leaf_bounds", "is_float_leaf", "is_int_leaf", "is_bounded_float_leaf", "sample_leaf_numpy", "sample_from_space", "invalid_leaf_values", "INDEX_ERRORS", "VALUE_ERRORS", "STRUCTURE_ERRORS", "STATE_ERRORS"]
