"""`unienv-data verify PATH`: checks that a dataset is intact; exit code 1 (and a message naming the file) when not.

Checks, in order:

1. metadata: every metadata file parses, has a format version this library reads, names storage types from the
   registry and paths inside the dataset directory, and agrees with the others (capacities, lengths, segments);
2. files: every data file has the size its metadata promises (array files: rows x row bytes; video files: the
   bytes recorded when they were written; image files: present for every row recorded as written);
3. opening: the dataset opens read-only with the library's own `load_from` (which repeats its own checks);
4. rows: every row of every storage reads (video frames are decoded), and every stored sample lies inside its
   space's bounds (rows of recorded data only);
5. checksums, where present: `checksums.sha256` at the dataset root (`sha256sum` format, written by
   `verify --write-checksums` on a dataset that verified clean) and `sha256` entries in storage metadata.

`--quick` stops after step 3 (no data is read).

`--remove-orphans` first opens the dataset writable and deletes the files no row reads from that a crash or an
interrupted write left in its `VideoStorage` directories (`.active-*.tmp.<ext>` files being encoded, superseded video
files: `VideoStorage.remove_orphan_files()` of every video storage in it), printing each removed file; then it checks
as above. No other process may be writing the dataset meanwhile.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from unienv_data.base.files import replacing_file

from ._common import CLIError, Progress, add_backend_flag, add_output_flags, human_bytes, print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser("verify", help="check metadata, file sizes, rows and checksums; exit 1 on damage",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="dataset directory (or one .memmap array file)")
    p.add_argument("--quick", action="store_true", help="metadata, file sizes and opening only; read no rows")
    p.add_argument("--write-checksums", action="store_true",
                   help="after a clean check, write checksums.sha256 (SHA-256 of every file) at the dataset root")
    p.add_argument("--remove-orphans", action="store_true",
                   help="first delete files left over by a crash in video storage directories (opens the dataset "
                        "writable: no other process may write it meanwhile), listing each; then check")
    add_backend_flag(p)
    add_output_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ._foreign import detect, verify_foreign
    fmt = detect(args.path)   # another tool's dataset (a LeRobot or Minari folder)
    if fmt and args.write_checksums:
        raise CLIError(f"--write-checksums writes this library's checksum file; {args.path} is a {fmt} dataset")
    if fmt and args.remove_orphans:
        raise CLIError(f"--remove-orphans cleans this library's video storages; {args.path} is a {fmt} dataset")
    removed = remove_orphans(args.path, args.backend) if args.remove_orphans else None
    report = (verify_foreign(fmt, args.path, read_rows=not args.quick, backend=args.backend, progress=not args.quiet)
              if fmt else verify(args.path, read_rows=not args.quick, backend=args.backend, progress=not args.quiet))
    if removed is not None:
        report["orphans_removed"] = removed
    if report["ok"] and args.write_checksums:
        report["checksums_written"] = write_checksums(report["root_dir"], report["files"])
    if args.json:
        print_json({k: v for k, v in report.items() if k not in ("files",)})
    else:
        for line in render(report):
            print(line)
    return 0 if report["ok"] else 1


def remove_orphans(path: str, backend: str = "auto") -> List[str]:
    """Opens the dataset at `path` writable and removes the orphan files of every `VideoStorage` in it
    (`VideoStorage.remove_orphan_files()`); returns the removed files, relative to the dataset directory. CLIError
    when the dataset does not open writable (damaged metadata: run `verify` to see why)."""
    from unienv_data.inspect import open_dataset
    from unienv_data.storages.video_storage import video_storages_in
    path = os.path.abspath(path)
    root_dir = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        ds = open_dataset(path, backend=backend, read_only=False)
    except Exception as exc:  # noqa: BLE001 - every failure to open is reported with the library's message
        raise CLIError(f"--remove-orphans: {path} does not open writable ({type(exc).__name__}: {exc}); run "
                       "`unienv-data verify PATH` without it to see the problems") from None
    removed: List[str] = []
    with ds:
        for st in video_storages_in(ds.storage):
            where = os.fspath(st.cache_filename or root_dir)
            removed.extend(os.path.relpath(os.path.join(where, name), root_dir) for name in st.remove_orphan_files())
    return removed


# ---------------------------------------------------------------------------------------------------- checks
def verify(path: str, read_rows: bool = True, backend: str = "auto", progress: bool = False) -> Dict[str, Any]:
    """Runs the checks of the module docstring; returns a JSON-ready report (`ok`, `problems`, `checked`, ...)."""
    from unienv_data.inspect import walk
    path = os.path.abspath(path)
    problems: List[str] = []
    warnings: List[str] = []
    checked: Dict[str, Any] = {}
    try:
        root = walk(path)
    except (OSError, ValueError) as exc:
        return _report(path, path, None, [str(exc)], [], {}, [])
    root_dir = path if os.path.isdir(path) else os.path.dirname(path)
    nodes = list(root.iter())
    for n in nodes:
        problems.extend(n.problems)
        warnings.extend(n.notes)
    records = [f for n in nodes for f in n.files]
    checked["metadata_files"] = sum(1 for f in records if f.role == "metadata")
    checked["format_versions"] = sorted({n.format_version for n in nodes if n.format_version is not None})
    problems.extend(_check_sizes(records))
    checked["data_files"] = sum(1 for f in records if f.role != "metadata")
    checked["data_bytes"] = sum(f.size or 0 for f in records if f.role != "metadata")
    cs_problems, cs_count = _check_checksums(root_dir, records)
    problems.extend(cs_problems)
    checked["checksums"] = cs_count
    if not problems:
        p2, w2, c2 = _check_open_and_read(path, root, read_rows, backend, progress)
        problems.extend(p2)
        warnings.extend(w2)
        checked.update(c2)
    return _report(path, root_dir, root.kind, problems, warnings, checked, [f.rel for f in records])


def _report(path: str, root_dir: str, kind: Optional[str], problems: List[str], warnings: List[str],
            checked: Dict[str, Any], files: List[str]) -> Dict[str, Any]:
    return {"path": path, "root_dir": root_dir, "kind": kind, "ok": not problems, "problems": problems,
            "warnings": warnings, "checked": checked, "files": files}


def _check_sizes(records: List[Any]) -> List[str]:
    out = []
    for f in records:
        if f.role == "metadata":
            continue
        if f.size is None:
            out.append(f"{f.rel}: file is missing" + (f" (the metadata records {f.detail})" if f.detail else ""))
        elif f.expected is not None and f.size != f.expected:
            state = "truncated" if f.size < f.expected else "larger than its metadata says"
            out.append(f"{f.rel}: holds {f.size} bytes, but its metadata promises {f.expected} ({f.detail}): the file "
                       f"is {state}")
        elif f.minimum is not None and f.size < f.minimum:
            what = "is empty" if f.size == 0 else "is truncated"
            out.append(f"{f.rel}: holds {f.size} bytes, but its metadata promises at least {f.minimum} ({f.detail}): "
                       f"the file {what}")
    return out


def _sha256(full: str) -> str:
    h = hashlib.sha256()
    with open(full, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_checksums(root_dir: str, records: List[Any]) -> Tuple[List[str], int]:
    from unienv_data.inspect import CHECKSUM_FILE
    problems: List[str] = []
    count = 0
    expected: Dict[str, str] = {}
    listing = os.path.join(root_dir, CHECKSUM_FILE)
    if os.path.isfile(listing):
        with open(listing, "r") as fh:
            for i, line in enumerate(fh, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                digest, _, name = line.partition(" ")
                name = name.strip().lstrip("*")
                if len(digest) != 64 or not name:
                    problems.append(f"{CHECKSUM_FILE}: line {i} is not '<sha256>  <path>'")
                    continue
                expected[os.path.normpath(name)] = digest.lower()
    for f in records:
        if f.sha256:
            expected.setdefault(os.path.normpath(f.rel), f.sha256.lower().replace("sha256:", ""))
    real_root = os.path.realpath(root_dir)
    for name, digest in sorted(expected.items()):
        full = os.path.realpath(os.path.join(root_dir, name))
        if os.path.isabs(name) or not (full == real_root or full.startswith(real_root + os.sep)):
            problems.append(f"{CHECKSUM_FILE}: path {name!r} points outside the dataset directory")
            continue
        if not os.path.isfile(full):
            problems.append(f"{name}: file is missing (a checksum was recorded for it)")
            continue
        count += 1
        got = _sha256(full)
        if got != digest:
            problems.append(f"{name}: SHA-256 is {got}, the recorded checksum is {digest}: the file changed since "
                            "the checksum was written")
    return problems, count


def write_checksums(root_dir: str, files: List[str]) -> str:
    """Writes `checksums.sha256` (sha256sum format) for `files` (paths relative to `root_dir`); returns its path."""
    from unienv_data.inspect import CHECKSUM_FILE
    lines = [f"{_sha256(os.path.join(root_dir, rel))}  {rel}\n" for rel in sorted(set(files)) if rel != CHECKSUM_FILE]
    target = os.path.join(root_dir, CHECKSUM_FILE)
    with replacing_file(target) as tmp:
        with open(tmp, "w") as fh:
            fh.writelines(lines)
    return target


def _row_bytes(space: Any) -> int:
    from unienv_data.inspect import leaf_items, leaf_nbytes
    from unienv_interface.space.space_utils.serialization_utils import space_to_json
    try:
        return max(1, sum(leaf_nbytes(js) for _, js in leaf_items(space_to_json(space))))
    except (TypeError, ValueError):
        return 1024


def _bounds_checker(space: Any) -> Optional[Any]:
    """A function `(values) -> bad row mask` for a bounded Box leaf, else None."""
    from unienv_interface.space import BoxSpace
    if not isinstance(space, BoxSpace):
        return None
    low, high = np.asarray(space.low_numpy), np.asarray(space.high_numpy)
    if low.dtype.kind == "f" and np.all(np.isneginf(low)) and np.all(np.isposinf(high)):
        return None

    def bad(v: np.ndarray) -> np.ndarray:
        if v.dtype.kind not in "biuf":
            return np.zeros(v.shape[0], dtype=bool)
        ok = np.asarray((v >= low) & (v <= high), dtype=bool)
        return np.asarray(~ok.reshape(v.shape[0], -1).all(axis=1))
    return bad


def _check_open_and_read(path: str, root: Any, read_rows: bool, backend: str, progress: bool
                         ) -> Tuple[List[str], List[str], Dict[str, Any]]:
    from unienv_data.inspect import flatten_tree, open_dataset
    problems: List[str] = []
    warnings: List[str] = []
    checked: Dict[str, Any] = {}
    try:
        ds = open_dataset(path, backend=backend, root=root)
    except ImportError as exc:
        return [f"{root.metadata_rel or path}: cannot be opened here: {exc}"], warnings, checked
    except Exception as exc:  # noqa: BLE001 - every failure to open is reported with the library's message
        return [f"{root.metadata_rel or path}: does not open: {type(exc).__name__}: {exc}"], warnings, checked
    root_dir = path if os.path.isdir(path) else os.path.dirname(path)
    with ds:
        checked["opened"] = True
        checked["length"] = len(ds)
        checked["episodes"] = len(ds.episodes())
        loose = _rows_outside_episodes(ds)
        checked["rows_outside_episodes"] = int(loose.size)
        if loose.size:
            warnings.append(f"{root.metadata_rel or path}: {loose.size} of {len(ds)} visible rows belong to no "
                            f"episode (rows {_ranges_text(loose)}): rows of a commit that did not finish, or of an "
                            "episode still open when the buffer was saved; they may mix values of different "
                            "episodes (e.g. one episode's state with another's camera frame)")
        if not read_rows:
            return problems, warnings, checked
        valid = _recorded_rows(ds)
        columns = ds.columns()
        n_rows = len(ds.storage)
        # rows in use only (a preallocated ring's unwritten rows hold nothing to check); every storage reads them
        in_use = np.flatnonzero(valid) if valid is not None else np.arange(n_rows, dtype=np.int64)
        t0 = time.perf_counter()
        storage_rows = 0
        out_of_bounds: Dict[str, List[int]] = {}
        # the bar counts steps (rows in use, every storage read), the measure `stats` and `convert` report too
        with Progress(int(in_use.size), "verifying rows", "rows", enabled=progress) as bar:
            for child, prefix, keys in columns:
                where = _child_name(root_dir, child) or path
                chunk = max(1, min(4096, (32 << 20) // _row_bytes(child.single_instance_space)))
                checkers = {k: _bounds_checker(ds.leaf_spaces[k]) for k in keys}
                for s in range(0, int(in_use.size), chunk):
                    rows = in_use[s:s + chunk]
                    try:
                        values = flatten_tree(child.get(rows), prefix)
                    except Exception as exc:  # noqa: BLE001 - report the storage and the rows that failed
                        problems.append(f"{where}: reading rows {int(rows[0])}..{int(rows[-1])} failed: "
                                        f"{type(exc).__name__}: {exc}")
                        storage_rows += int(in_use.size) - s
                        bar.update(storage_rows // len(columns) - bar.done)
                        break
                    storage_rows += int(rows.size)
                    bar.update(storage_rows // len(columns) - bar.done)
                    for k, v in values.items():
                        check = checkers.get(k)
                        if check is None:
                            continue
                        bad = check(np.asarray(ds.backend.to_numpy(v)))
                        if bad.any():
                            out_of_bounds.setdefault(k, []).extend(rows[np.flatnonzero(bad)].tolist()[:5])
        for k, bad_rows in out_of_bounds.items():
            sp = ds.leaf_spaces[k]
            # recorded values outside the declared bounds are accepted (with a BoundsWarning, as in the reference
            # and gymnasium): a note, not damage
            warnings.append(f"{_leaf_owner(root, k) or path}: key {k!r} holds values outside its space bounds "
                            f"[{np.min(sp.low_numpy)}, {np.max(sp.high_numpy)}] at storage rows {bad_rows[:5]}; "
                            "they were stored as given (recording warns with a BoundsWarning; "
                            "warnings.simplefilter('error', BoundsWarning) refuses them)")
        checked["rows_read"] = int(in_use.size)
        checked["capacity_rows"] = n_rows
        checked["keys_out_of_bounds"] = sorted(out_of_bounds)
        checked["storages_read"] = len(columns)
        checked["read_seconds"] = time.perf_counter() - t0
    return problems, warnings, checked


def _recorded_rows(ds: Any) -> Optional[np.ndarray]:
    """Physical rows holding recorded data (the buffer's rows, or the segments of a bare storage)."""
    n = len(ds.storage)
    mask = np.zeros(n, dtype=bool)
    if ds.is_buffer:
        if len(ds):
            mask[ds.physical(np.arange(len(ds)))] = True
        return mask
    eps = ds.episodes()
    if not eps:
        return None
    for s, e in eps:
        mask[ds.physical(np.arange(s, e))] = True
    return mask


def _rows_outside_episodes(ds: Any) -> np.ndarray:
    """Visible rows of a buffer that records episodes but lists none of them in one (empty otherwise)."""
    eps = ds.episodes() if ds.is_buffer else []
    if not eps:
        return np.zeros(0, dtype=np.int64)
    covered = np.zeros(len(ds), dtype=bool)
    for s, e in eps:
        covered[s:e] = True
    return np.flatnonzero(~covered)


def _ranges_text(rows: np.ndarray, limit: int = 3) -> str:
    """`a..b, c..d` for the first `limit` consecutive runs of sorted `rows`."""
    breaks = np.flatnonzero(np.diff(rows) != 1)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [rows.size - 1]])
    runs = [f"{int(rows[a])}..{int(rows[b])}" for a, b in zip(starts[:limit], ends[:limit])]
    return ", ".join(runs) + (", ..." if starts.size > limit else "")


def _child_name(root_dir: str, child: Any) -> Optional[str]:
    """The child's file or directory relative to the dataset root."""
    name = getattr(child, "cache_filename", None)
    return os.path.relpath(os.fspath(name), root_dir) if name else None


def _leaf_owner(root: Any, key: str) -> Optional[str]:
    best = None
    for n in root.iter():
        if key in n.leaves and n.files:
            best = n.rel
    return best


def render(r: Dict[str, Any]) -> List[str]:
    c = r["checked"]
    lines = [f"verifying {r['path']} ({r['kind'] or 'unknown kind'})"]
    if "metadata_files" in c:
        versions = ", ".join(map(str, c.get("format_versions", []))) or "?"
        lines.append(f"  metadata: {c['metadata_files']} files read (format version {versions})")
        lines.append(f"  files: {c['data_files']} data files, {human_bytes(c['data_bytes'])}, sizes checked against "
                     "their metadata")
    if c.get("opened"):
        lines.append(f"  opened read-only: {c['length']} steps, {c['episodes']} episodes")
    if "rows_read" in c:
        outside = c.get("keys_out_of_bounds") or []
        bounds = (f"{len(outside)} key(s) hold values outside their space bounds (see below)" if outside else
                  "recorded values inside their space bounds")
        cap = c.get("capacity_rows")
        room = f" (of {cap} preallocated)" if cap is not None and cap != c["rows_read"] else ""
        lines.append(f"  rows: the {c['rows_read']} rows in use{room} read from each of {c['storages_read']} "
                     f"storages in {c['read_seconds']:.2f} s; {bounds}")
    if "checksums" in c:
        lines.append(f"  checksums: {c['checksums']} files checked" if c["checksums"] else
                     "  checksums: none recorded (write them with --write-checksums)")
    if "orphans_removed" in r:
        gone = r["orphans_removed"]
        lines.append(f"  removed {len(gone)} orphan file(s)" + (": " + ", ".join(gone) if gone else ""))
    if r.get("checksums_written"):
        lines.append(f"  wrote {r['checksums_written']}")
    for w in r["warnings"]:
        lines.append(f"  note: {w}")
    if r["ok"]:
        lines.append("OK")
    else:
        lines.append(f"DAMAGED: {len(r['problems'])} problem(s)")
        lines.extend(f"  {p}" for p in r["problems"])
    return lines
