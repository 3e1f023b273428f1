"""File helpers shared by every on-disk storage: atomic JSON metadata, confined paths, checked reads."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from typing import Any, Dict, Iterable, Iterator, NamedTuple, Optional, Tuple, Union

from .errors import StorageFormatError, StorageNotFoundError

PathLike = Union[str, "os.PathLike[str]"]

#: Version of the metadata written by this library; files without the field are reference-written (version 0).
FORMAT_VERSION = 1

_DURABLE = os.environ.get("UNIENV_DURABLE", "0") not in ("", "0", "false", "False")


def set_durable(enabled: bool) -> None:
    """Chooses what a commit point (`dumps`, `flush`) survives.

    Always: a crash or kill of the writing process at any instant (data is written before the metadata that
    describes it, and metadata files are replaced by an atomic rename). With `enabled` (or the environment
    variable `UNIENV_DURABLE=1`) also a power loss: data pages and metadata files are fsync'ed, and so is the
    directory after each rename. Off by default because fsync costs milliseconds per commit point.
    """
    global _DURABLE
    _DURABLE = bool(enabled)


def is_durable() -> bool:
    """Whether commit points fsync (see `set_durable`)."""
    return _DURABLE


def fsync_dir(path: PathLike) -> None:
    """Flushes a directory entry (so a rename inside it survives a power cut); a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Written(NamedTuple):
    data: bytes     # the bytes themselves: comparing them (memcmp) is cheaper than hashing a large file per commit
    durable: bool
    identity: Tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns) of the file we renamed in


#: What this process last wrote at each metadata path, so an unchanged rewrite can be skipped (see below).
_LAST_WRITTEN: Dict[str, _Written] = {}
_LAST_WRITTEN_LOCK = threading.Lock()


def _identity(path: str) -> Optional[Tuple[int, int, int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class EncodedJSON(str):
    """A top-level value of a metadata dict that is JSON text already (`encoded_json(value)`): `json_text` writes
    it as it is. Metadata rewritten at every commit point keeps its large static parts (a space holding an image's
    per-pixel bounds is hundreds of kB) encoded once instead of encoding them again each time."""


def encoded_json(value: Any) -> EncodedJSON:
    """`value` encoded once, for `json_text` / `atomic_write_json` to splice in as it is."""
    return EncodedJSON(_COMPACT.encode(value))


def json_text(obj: Any) -> str:
    """`obj` as JSON text, one top-level key per line (readable with `cat`, diffable) and each value on its line in
    compact form: written by the C encoder, several times faster than ``indent=`` (Python's pure-Python path) on
    metadata holding long segment lists. Top-level `EncodedJSON` values are written as they are."""
    if isinstance(obj, dict) and obj and all(type(k) is str for k in obj):
        enc = _COMPACT.encode
        return "{\n" + ",\n".join(f" {enc(k)}: {v if type(v) is EncodedJSON else enc(v)}"
                                   for k, v in obj.items()) + "\n}"
    return json.dumps(obj, indent=1, allow_nan=True)


_COMPACT = json.JSONEncoder(allow_nan=True, separators=(", ", ": "))


def atomic_write_json(path: PathLike, obj: Any, durable: Optional[bool] = None) -> None:
    """Writes `obj` as JSON to `path` so that readers see either the old or the new file, never a torn one:
    temporary file in the same directory, flush (+ fsync when durable, see `set_durable`), rename over `path`,
    fsync the directory (when durable).

    A rewrite with the same bytes is skipped when the file on disk is still the very file this process wrote
    (same device, inode, size and modification time) at least as durably: a `dumps` that changes one metadata file
    of a composite storage then renames one file instead of every one."""
    durable = _DURABLE if durable is None else durable
    path = os.fspath(path)
    key = os.path.abspath(path)
    data = json_text(obj).encode("utf-8")
    with _LAST_WRITTEN_LOCK:
        last = _LAST_WRITTEN.get(key)
    if last is not None and last.data == data and (last.durable or not durable) \
            and _identity(path) == last.identity:
        return
    directory = os.path.dirname(key)
    try:
        fd, tmp = _open_temporary(directory, os.path.basename(path))
    except FileNotFoundError:       # the directory is new (made only then: a commit point skips the mkdir call)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = _open_temporary(directory, os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
            st = os.fstat(f.fileno())   # a rename keeps inode and mtime; taken here, no other writer can race it
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if durable or not _swap_into_place(tmp, path):
            os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        with _LAST_WRITTEN_LOCK:
            _LAST_WRITTEN.pop(key, None)
        raise
    if durable:
        fsync_dir(directory)
    with _LAST_WRITTEN_LOCK:
        _LAST_WRITTEN[key] = _Written(data, durable, identity)


_RENAME_EXCHANGE = 2
_renameat2: Any = None      # libc's renameat2 once looked up; False where there is none


def _swap_into_place(tmp: str, path: str) -> bool:
    """Puts `tmp` at `path` by exchanging the two names atomically (Linux `renameat2(RENAME_EXCHANGE)`), then
    removes the old file (now at `tmp`); False where that is not possible (no such call, no file at `path` yet, a
    file system without it): the caller then renames as usual.

    Why: ext4 (`auto_da_alloc`) writes a file's data out before a rename that *replaces* another file, which made
    every metadata rewrite wait for the disk (2-5 ms next to a memory map being written, against 0.05 ms for the
    exchange), and a commit point rewrites several. Readers see the old or the new file either way, and a killed
    process leaves one or the other; surviving a power loss needs durable commit points (`set_durable`), which
    fsync and rename as usual."""
    global _renameat2
    if _renameat2 is None:
        _renameat2 = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL(None, use_errno=True).renameat2
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _renameat2 = fn
            except (OSError, AttributeError):
                pass
    if _renameat2 is False:
        return False
    at_cwd = -100
    if _renameat2(at_cwd, os.fsencode(tmp), at_cwd, os.fsencode(path), _RENAME_EXCHANGE) != 0:
        return False        # ENOENT (nothing to replace yet), EINVAL / ENOSYS (not supported here), ...
    remove_quietly(tmp)     # a leftover would be hidden, holding the old metadata: ignored by every reader
    return True


def _open_temporary(directory: str, name: str) -> Tuple[int, str]:
    """A new temporary file `.<name>.<random>.tmp` in `directory`, opened for writing, whose mode follows the umask
    like any file the process creates (``0o666 & ~umask``). `tempfile.mkstemp` always makes 0600 files: renamed over
    a dataset's metadata, they kept a teammate (or a training job running as another uid) from opening it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary file name for {name!r} in {directory}")


def remove_quietly(path: Optional[PathLike]) -> None:
    """Removes the file at `path` (None: nothing), ignoring every OSError (a file already gone, say): for clean-up
    paths, where a failure must not hide the error being handled."""
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass


def remove_if_present(path: PathLike) -> None:
    """Removes the file at `path` when there is one (any other error is raised: the file must go)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def temporary_path(final: PathLike) -> str:
    """A fresh hidden temporary file name next to `final` (same directory, so a rename replaces `final` atomically):
    `.<name>.<random>.tmp`, which every reader of a dataset directory ignores."""
    d, base = os.path.split(os.fspath(final))
    return os.path.join(d, f".{base}.{os.urandom(6).hex()}.tmp")


@contextlib.contextmanager
def replacing_file(path: PathLike, durable: Optional[bool] = None) -> Iterator[str]:
    """The one way a data file is replaced whole: yields a temporary path next to `path`, where the caller writes the
    complete new file (and closes it); then the file is fsynced (when durable, see `set_durable`), renamed over
    `path` and the directory fsynced (when durable). Readers see the old file or the whole new one. An exception in
    the block (or in the rename) removes the temporary file and leaves `path` as it was."""
    durable = _DURABLE if durable is None else durable
    final = os.fspath(path)
    tmp = temporary_path(final)
    try:
        yield tmp
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        remove_quietly(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(final)))


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether `a` and `b` name the same file (by path when either cannot be inspected)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def link_or_copy(src: str, dst: str, tmp: Optional[str] = None) -> None:
    """Makes `dst` a copy of `src` atomically (readers see the old `dst` or the whole new one): a hard link when the
    file system allows it, else a copy, made under the temporary name `tmp` (default `temporary_path(dst)`) and
    renamed over `dst`. Safe because storages never modify a data file in place (they replace it)."""
    if os.path.exists(dst) and same_file(src, dst):
        return  # already a link to the same file (rename() between two links of one file would do nothing)
    tmp = temporary_path(dst) if tmp is None else tmp
    try:
        try:
            os.link(src, tmp)
        except OSError:
            import shutil
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.lexists(tmp):    # an error, or a rename between two links of one file (which keeps both)
            remove_quietly(tmp)


DUMP_MARKER_SUFFIX = ".dump-in-progress"


def dump_marker(path: PathLike) -> str:
    """The marker that exists while `dumps()` writes into `path` (a directory or a single data file)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return os.path.join(path, DUMP_MARKER_SUFFIX)
    return path + DUMP_MARKER_SUFFIX


@contextlib.contextmanager
def dump_transaction(path: PathLike, directory: bool) -> Iterator[None]:
    """Marks `path` as being dumped into until the block finishes, so a dump killed halfway leaves a directory
    that refuses to load (`check_no_interrupted_dump`) instead of one that mixes old metadata with new data."""
    path = os.fspath(path)
    if directory:
        os.makedirs(path, exist_ok=True)
        marker = os.path.join(path, DUMP_MARKER_SUFFIX)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        marker = path + DUMP_MARKER_SUFFIX
    with open(marker, "w") as f:
        f.write("dumps() in progress; if this file survives, the dump was interrupted\n")
        if _DURABLE:
            f.flush()
            os.fsync(f.fileno())
    if _DURABLE:
        fsync_dir(os.path.dirname(os.path.abspath(marker)))
    yield
    os.unlink(marker)
    if _DURABLE:
        fsync_dir(os.path.dirname(os.path.abspath(marker)))


def check_no_interrupted_dump(path: PathLike, what: str) -> None:
    """StorageFormatError when an earlier `dumps()` into `path` did not finish (its files may not match)."""
    path = os.fspath(path)
    marker = os.path.join(path, DUMP_MARKER_SUFFIX) if os.path.isdir(path) else path + DUMP_MARKER_SUFFIX
    if os.path.exists(marker):
        raise StorageFormatError(f"{what} at {path}: an earlier dumps() into it was interrupted (found {marker}); its "
                                 "files may mix two states. Dump the source again, or restore the directory")


def read_json(path: PathLike, what: str) -> Dict[str, Any]:
    """Reads a JSON object; a missing file is StorageNotFoundError, a damaged one StorageFormatError."""
    path = os.fspath(path)
    data = load_json(path, what)
    if not isinstance(data, dict):
        raise StorageFormatError(f"{what} at {path} must hold a JSON object, got {type(data).__name__}")
    return data


def load_json(path: PathLike, what: str) -> Any:
    """Reads any JSON value; a missing file is StorageNotFoundError, a damaged one StorageFormatError (the
    messages name `what` and `path`)."""
    path = os.fspath(path)
    try:
        with open(path, "r") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise StorageNotFoundError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise StorageFormatError(f"{what} at {path} is a directory, not a file") from None
    except (ValueError, RecursionError) as exc:     # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise StorageFormatError(f"{what} at {path} is damaged (not valid JSON: {str(exc)[:200]})") from None
    except OSError as exc:
        raise StorageFormatError(f"{what} at {path} cannot be read: {exc}") from None
    return data


def require_fields(data: Dict[str, Any], fields: Iterable[str], what: str) -> None:
    """StorageFormatError naming every missing field."""
    missing = [f for f in fields if f not in data]
    if missing:
        raise StorageFormatError(f"{what} is missing field(s) {missing}")


def check_format_version(data: Dict[str, Any], what: str) -> int:
    """The metadata's format version (0 for reference-written files); newer than this library is an error."""
    v = data.get("format_version", 0)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise StorageFormatError(f"{what} has an invalid format_version {v!r}")
    if v > FORMAT_VERSION:
        raise StorageFormatError(f"{what} has format_version {v}, newer than this library supports ({FORMAT_VERSION}); upgrade")
    return v


def confined_path(root: PathLike, relative: Any, what: str, root_real: Optional[str] = None) -> str:
    """`root/relative`, refusing anything that would leave `root` (absolute paths, '..', symlinks out).
    `root_real`: ``os.path.realpath(root)`` when the caller already has it (checking many entries of one root)."""
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise StorageFormatError(f"{what}: invalid relative path {relative!r}")
    if os.path.isabs(relative):
        raise StorageFormatError(f"{what}: path {relative!r} must be relative to the dataset directory")
    if root_real is None:
        root_real = os.path.realpath(os.fspath(root))
    full = os.path.realpath(os.path.join(root_real, relative))
    if full == root_real:
        raise StorageFormatError(f"{what}: path {relative!r} names the dataset directory itself, not a file in it")
    if not full.startswith(root_real + os.sep):
        raise StorageFormatError(f"{what}: path {relative!r} points outside the dataset directory {root}")
    return os.path.join(os.fspath(root), relative)


# ------------------------------------------------------------------------------------------ never replace silently
class _CreatingDepth(threading.local):
    depth = 0   # how many `creating_dataset` blocks this thread is inside


_CREATING = _CreatingDepth()


def refuse_existing_dataset(path: PathLike, overwrite: bool, what: str, opener: str) -> None:
    """FileExistsError when `create(cache_path=path)` would replace something already at `path` (a file, or a
    directory that is not empty) and the caller did not pass `overwrite=True`. Inside `creating_dataset` (a
    composite storage creating its children in the directory it was allowed to use) nothing is checked again.
    `opener` names the call that opens what is there instead (e.g. ``ReplayBuffer.load_from(path, backend=...)``)."""
    if overwrite or _CREATING.depth:
        return
    path = os.fspath(path)
    if os.path.isdir(path):
        if not os.listdir(path):
            return
    elif not os.path.exists(path):
        return
    raise FileExistsError(f"{what}.create: {path} already exists and holds data; create() would replace it. Pass "
                          f"overwrite=True to replace it, or open it with {opener}")


def replacing_allowed() -> bool:
    """True inside `creating_dataset`, i.e. while a `create()` whose path was checked (new, empty, or replaced
    with `overwrite=True`) builds its files: a storage may then clear old files it finds in its own directory."""
    return _CREATING.depth > 0


@contextlib.contextmanager
def creating_dataset(path: Optional[PathLike], overwrite: bool, what: str, opener: str) -> Iterator[None]:
    """Checks `path` with `refuse_existing_dataset`, then lets the storages created inside the block write there
    (the children of a composite storage, the storage of a replay buffer) without checking again."""
    if path is not None:
        refuse_existing_dataset(path, overwrite, what, opener)
    _CREATING.depth += 1
    try:
        yield
    finally:
        _CREATING.depth -= 1
