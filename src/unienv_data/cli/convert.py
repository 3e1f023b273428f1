"""`unienv-data convert SRC DST --layout {flattened,native,native-video}`: rewrite a dataset in another layout.

SRC is any dataset `info` recognises (a ReplayBuffer directory or a storage); DST is written as a `ReplayBuffer`
directory with the same space and capacity, rows in SRC's logical order (oldest first), every episode (segment)
kept with its boundaries, rows outside any episode copied as they are. Layouts:

* `flattened`: one `FlattenedStorage` row per step (the reference layout; mixed dtypes are promoted to one row
  dtype, so uint8 images next to float32 keys take 4x their bytes: a FlattenPromotionWarning says so);
* `native`: the native layout (every leaf in its own dtype, low-dimensional leaves in one flat row per dtype,
  images in their own uint8 array storage);
* `native-video`: the same with images in a `VideoStorage` (`--codec`, `--lossless`, `--crf`, `--gop`).

`--gop N` is the keyframe interval of the videos (native-video and `--to lerobot`): a random frame decodes from the
keyframe before it, so a short GOP reads random training windows faster and a long one makes smaller files.

The copy streams: SRC is read `--chunk` rows at a time, so memory stays bounded by one chunk whatever the size.

Other tools' formats:

* `--from FORMAT` reads SRC as another tool's dataset and writes DST in `--layout` as above: `lerobot`, a LeRobot
  dataset folder (v2.0, v2.1, v3.0; one segment per LeRobot episode; `--layout` defaults to `native-video`, whose
  videos record the dataset's fps and, when lossy, LeRobot's GOP of 2 unless `--gop` says otherwise); `minari`, a
  Minari folder (HDF5 or Arrow); `hf`, a Hugging Face dataset saved with `save_to_disk` (episodes from
  `--episode-column`).
* `--to FORMAT` writes DST in another tool's format instead of a layout: `lerobot`, a LeRobot v3.0 dataset
  (`--fps N`, default SRC's; SRC's keys are the feature names, nested keys joined with dots, or `--map ours=theirs`
  renames them, `--exclude KEY` leaves one out; uint8 (H, W, 3) keys become video cameras, the rest tabular
  features; `--task TEXT` is every episode's task, or `--task-key KEY --task-names FILE|DIR` every frame's);
  `minari`, a folder that `minari.load_dataset` opens (`--minari-format`, `--dataset-id`, `--final-observation`;
  SRC's keys `observations`, `actions`, ... or those of a ReplayBufferCollectionWrapper recording, `obs`, `action`,
  `reward`, `terminated`, `truncated`, `next_obs`, are found by themselves, `--map KEY=FIELD` names others and
  `--exclude KEY` leaves one out).
* `--from` and `--to` combine (e.g. `--from lerobot --to minari`): the rows go through without a copy in between.
"""
from __future__ import annotations

import argparse
import importlib
import os
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ._common import (CLIError, Progress, add_backend_flag, add_output_flags, human_bytes, prepare_output_dir,
                      print_json, rate)

LAYOUTS = ("flattened", "native", "native-video")
#: `--from FORMAT`: "module:function(path, backend, args)" returning a source with the face of an OpenedDataset
IMPORTERS: Dict[str, str] = {
    "hf": "unienv_data.cli._minari_hf:open_hf",
    "lerobot": "unienv_data.cli._lerobot:open_lerobot",
    "minari": "unienv_data.cli._minari_hf:open_minari",
}
#: `--from FORMAT` without `--layout` or `--to`: the layout DST gets (formats not named here need `--layout`)
DEFAULT_LAYOUTS: Dict[str, str] = {"lerobot": "native-video"}
#: `--from FORMAT` into `native-video` without `--gop` (and without `--lossless`): the keyframe interval DST gets
DEFAULT_GOPS: Dict[str, int] = {"lerobot": 2}
#: `--to FORMAT`: "module:function(src, dst, args, progress)" returning a summary dict (`episodes`, and optionally
#: `format`, a description printed after DST, and `notes`, lines printed after the summary)
EXPORTERS: Dict[str, str] = {
    "lerobot": "unienv_data.cli._lerobot:export_lerobot",
    "minari": "unienv_data.cli._minari_hf:export_minari",
}
#: `--to FORMAT`: "module:function(src, args)" checking the format's options before any progress or output
EXPORT_CHECKS: Dict[str, str] = {"lerobot": "unienv_data.cli._lerobot:check_lerobot_export"}
#: "module:function(parser)" adding each format's own options
FORMAT_ARGUMENTS: List[str] = ["unienv_data.cli._lerobot:add_lerobot_arguments",
                               "unienv_data.cli._minari_hf:add_minari_arguments"]


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("convert", help="rewrite a dataset in another layout (streaming, segments kept)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="dataset to read")
    p.add_argument("dst", metavar="DST", help="directory to write (must not exist or be empty, unless --force)")
    p.add_argument("--layout", choices=LAYOUTS, default=None,
                   help="layout of DST (required unless --to; --from lerobot defaults to native-video)")
    p.add_argument("--from", dest="src_format", choices=sorted(IMPORTERS), default=None,
                   help="read SRC as a dataset of another tool (default: a dataset of this library)")
    p.add_argument("--to", dest="dst_format", choices=sorted(EXPORTERS), default=None,
                   help="write DST in another tool's format instead of a --layout")
    p.add_argument("--capacity", type=int, default=None,
                   help="capacity of DST (default: SRC's capacity; 0 means growable)")
    p.add_argument("--chunk", type=int, default=256, help="rows read from SRC at a time (default 256)")
    p.add_argument("--codec", default="auto", help="native-video: encoder (default auto: the first that works here)")
    p.add_argument("--lossless", action="store_true", help="native-video: a lossless codec (frames kept exactly)")
    p.add_argument("--crf", type=int, default=None, help="native-video: quality of a lossy H.264/AV1 codec")
    p.add_argument("--gop", type=int, default=None, metavar="N",
                   help="native-video and --to lerobot: a keyframe every N frames (short: faster random reads; long: "
                        "smaller files; default 10, or 2 for --from lerobot and --to lerobot)")
    p.add_argument("--force", action="store_true", help="replace DST if it holds files")
    add_backend_flag(p)
    add_output_flags(p)
    for spec in FORMAT_ARGUMENTS:
        _resolve(spec)(p)
    p.set_defaults(run=run)


def storage_for_layout(space: Any, layout: str, codec: str = "auto", lossless: bool = False,
                       crf: Optional[int] = None, fps: Optional[float] = None,
                       gop: Optional[int] = None) -> Tuple[Any, Dict[str, Any]]:
    """`(storage class, ReplayBuffer.create kwargs)` of a layout; `fps` and `gop` (keyframe interval) are what
    `native-video` files record (default: VideoStorage's)."""
    if layout == "flattened":
        from unienv_data.storages.flattened import FlattenedStorage
        try:
            from unienv_data.storages.metadata_routing import backend_array_storage
            inner = backend_array_storage(space)
        except ImportError:
            inner = _array_storage(space)
        return FlattenedStorage, {"inner_storage_cls": inner}
    try:
        from unienv_data.storages.dict_storage import DictStorage
        from unienv_data.storages.native_layout import native_layout_kwargs
    except Exception as exc:  # noqa: BLE001 - a missing or broken module
        raise CLIError(f"--layout {layout} needs unienv_data.storages.native_layout, which could not be imported "
                       f"({type(exc).__name__}: {exc})") from None
    video_kwargs: Dict[str, Any] = {}
    if layout == "native-video":
        video_kwargs = {"codec": codec, "lossless": lossless}
        if crf is not None:
            video_kwargs["encoder_options"] = {"crf": str(crf)}
        if fps is not None:
            video_kwargs["fps"] = fps
        if gop is not None:
            video_kwargs["gop_size"] = gop
    try:
        kwargs = native_layout_kwargs(space, image_storage="video" if layout == "native-video" else "array",
                                      video_kwargs=video_kwargs or None)
    except TypeError as exc:
        raise CLIError(f"--layout {layout}: {exc}") from None
    return DictStorage, kwargs


def _array_storage(space: Any) -> Any:
    if space.backend.simplified_name == "pytorch":
        from unienv_data.storages.pytorch import PytorchTensorStorage
        return PytorchTensorStorage
    from unienv_data.storages.numpy_memmap import NumpyMemmapStorage
    return NumpyMemmapStorage


def pieces(n: int, episodes: List[Tuple[int, int]]) -> List[Tuple[int, int, bool]]:
    """`[(start, end, is_episode)]` covering `[0, n)`: the episodes and the stretches between them."""
    out: List[Tuple[int, int, bool]] = []
    at = 0
    for s, e in sorted(episodes):
        if s > at:
            out.append((at, s, False))
        out.append((s, e, True))
        at = e
    if at < n:
        out.append((at, n, False))
    return out


def row_of(batch: Any, i: int) -> Any:
    if isinstance(batch, dict):
        return {k: row_of(v, i) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)) and not hasattr(batch, "shape"):
        return type(batch)(row_of(v, i) for v in batch)
    return batch[i]


def open_source(args: argparse.Namespace, src: str) -> Any:
    """SRC opened read-only: a dataset of this library, or through the `--from` importer."""
    from unienv_data.inspect import open_dataset
    if args.src_format is None:
        return open_dataset(src, backend=args.backend)
    from ._batch_source import backend_class
    return _resolve(IMPORTERS[args.src_format])(src, backend_class(args.backend), args)


def run_export(args: argparse.Namespace, src: str, dst: str) -> int:
    """`--to FORMAT`: SRC written in another tool's format; a DST this run created is removed when it fails."""
    import shutil
    from ._batch_source import folder_bytes
    created = not os.path.exists(dst)
    prepare_output_dir(dst, set(), "convert", force=args.force)
    t_start = time.perf_counter()
    try:
        with open_source(args, src) as ds:
            n = len(ds)
            if args.dst_format in EXPORT_CHECKS:
                _resolve(EXPORT_CHECKS[args.dst_format])(ds, args)
            with Progress(n, f"converting to {args.dst_format}", "rows", enabled=not args.quiet) as bar:
                summary = _resolve(EXPORTERS[args.dst_format])(ds, dst, args, bar.update)
    except BaseException:
        if created:
            shutil.rmtree(dst, ignore_errors=True)
        raise
    seconds = time.perf_counter() - t_start
    summary = dict(summary, src=src, dst=dst, to=args.dst_format, rows=n, seconds=seconds, rows_per_s=rate(n, seconds),
                   bytes_after=folder_bytes(dst))
    if args.src_format is not None:
        summary["from"] = args.src_format
    if args.json:
        print_json(summary)
    else:
        print(f"converted {src} -> {dst} ({summary.get('format', args.dst_format)}): {n} rows, "
              f"{summary.get('episodes', '?')} episodes in {seconds:.2f} s ({summary['rows_per_s']:,.0f} rows/s), "
              f"{human_bytes(summary['bytes_after'])}")
        for note in summary.get("notes") or []:
            print(f"  note: {note}")
    return 0


#: flags of one format: (flag, args attribute, the side it belongs to (`dst_format`: --to, `src_format`: --from), the
#: formats of that side it applies to)
FORMAT_FLAGS: List[Tuple[str, str, str, Tuple[str, ...]]] = [
    ("--map", "map", "dst_format", ("lerobot", "minari")),
    ("--exclude", "exclude", "dst_format", ("lerobot", "minari")),
    ("--fps", "fps", "dst_format", ("lerobot",)),
    ("--task", "task", "dst_format", ("lerobot",)),
    ("--task-key", "task_key", "dst_format", ("lerobot",)),
    ("--task-names", "task_names", "dst_format", ("lerobot",)),
    ("--robot-type", "robot_type", "dst_format", ("lerobot",)),
    ("--minari-format", "minari_format", "dst_format", ("minari",)),
    ("--dataset-id", "dataset_id", "dst_format", ("minari",)),
    ("--final-observation", "final_observation", "dst_format", ("minari",)),
    ("--no-next-obs", "no_next_obs", "src_format", ("minari",)),
]


def _refuse_flags_of_other_formats(args: argparse.Namespace) -> None:
    """A format's flag given for a conversion it does not apply to is a CLIError, never silently ignored."""
    bad = []
    for flag, dest, side, formats in FORMAT_FLAGS:
        if getattr(args, dest, None) and getattr(args, side) not in formats:
            option = "--to" if side == "dst_format" else "--from"
            bad.append(f"{flag} applies to " + " / ".join(f"{option} {f}" for f in formats))
    if getattr(args, "episode_column", "auto") != "auto" and args.src_format != "hf":
        bad.append("--episode-column applies to --from hf")
    if bad:
        raise CLIError("; ".join(bad))


def run(args: argparse.Namespace) -> int:
    if args.chunk < 1:
        raise CLIError("--chunk must be at least 1")
    if args.layout is None and args.dst_format is None and args.src_format in DEFAULT_LAYOUTS:
        args.layout = DEFAULT_LAYOUTS[args.src_format]
    if (args.layout is None) == (args.dst_format is None):
        raise CLIError("give exactly one of --layout (a layout of this library) and --to (another tool's format)")
    _refuse_flags_of_other_formats(args)
    if args.layout is not None and args.layout != "native-video" and (
            args.lossless or args.crf is not None or args.codec != "auto"):
        raise CLIError("--codec, --lossless and --crf apply to --layout native-video")
    if args.gop is not None:
        if args.gop < 1:
            raise CLIError(f"--gop must be at least 1 (a keyframe every N frames), got {args.gop}")
        if args.layout not in (None, "native-video") or args.dst_format not in (None, "lerobot"):
            raise CLIError("--gop applies to --layout native-video and --to lerobot (the formats with videos)")
    elif args.layout == "native-video" and args.src_format in DEFAULT_GOPS and not args.lossless:
        args.gop = DEFAULT_GOPS[args.src_format]
    src, dst = os.path.abspath(args.src), os.path.abspath(args.dst)
    if dst == src or dst.startswith(src + os.sep) or src.startswith(dst + os.sep):
        raise CLIError("SRC and DST must be different, non-nested directories")
    if args.dst_format is not None:
        return run_export(args, src, dst)
    with open_source(args, src) as ds:
        return copy_to_buffer(ds, src, dst, args)


def source_fps(ds: Any) -> Optional[float]:
    """The frame rate of the source's cameras: its `fps` (a LeRobot folder's), else the one fps every `VideoStorage`
    of one of our datasets shares (None when there is none, or they differ)."""
    fps = getattr(ds, "fps", None)
    if fps is not None:
        return fps
    from unienv_data.storages.video_storage import video_storages_in
    found = {st.fps for st in video_storages_in(getattr(ds, "storage", None))}
    return found.pop() if len(found) == 1 else None


def copy_to_buffer(ds: Any, src: str, dst: str, args: argparse.Namespace) -> int:
    """Copies the opened source `ds` (an `OpenedDataset` or a `BatchSource`: `space`, `len`, `episodes()`,
    `capacity`, `read(idx)`) into a new ReplayBuffer at `dst` in `args.layout`, streaming
    `args.chunk` rows at a time, every episode kept with its boundaries; `native-video` files record `source_fps(ds)`.
    Prints the summary; returns the exit code."""
    import warnings
    from unienv_data.inspect import describe
    from unienv_data.replay_buffer import ReplayBuffer
    n = len(ds)
    episodes = ds.episodes()
    cap = ds.capacity if args.capacity is None else (args.capacity or None)
    if cap is not None and n > cap:
        raise CLIError(f"--capacity {cap} is smaller than the {n} rows of SRC")
    fps = source_fps(ds) if args.layout == "native-video" else None
    storage_cls, kwargs = storage_for_layout(ds.space, args.layout, args.codec, args.lossless, args.crf, fps=fps,
                                             gop=args.gop)
    prepare_output_dir(dst, set(), "convert", force=args.force)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rb = ReplayBuffer.create(storage_cls, ds.space, cache_path=dst, capacity=cap, **kwargs)
    notes = [str(w.message) for w in caught]
    for note in notes:
        if not args.quiet and not args.json:
            print(f"warning: {note}")
    t_start = time.perf_counter()
    try:
        with Progress(n, f"converting to {args.layout}", "rows", enabled=not args.quiet) as bar:
            for s, e, is_episode in pieces(n, episodes):
                for c in range(s, e, args.chunk):
                    idx = np.arange(c, min(e, c + args.chunk), dtype=np.int64)
                    batch = ds.read(idx)
                    if is_episode:
                        for i in range(idx.size):
                            rb.append(row_of(batch, i))
                    else:
                        rb.extend(batch)
                    bar.update(idx.size)
                if is_episode:
                    rb.mark_segment_end()
        rb.dumps()
    except BaseException:
        rb.close()
        raise
    rb.close()
    seconds = time.perf_counter() - t_start
    after = describe(dst)
    bytes_before = describe(src)["total_bytes"] if args.src_format is None else ds.total_bytes()
    summary = {"src": src, "dst": dst, "layout": args.layout, "rows": n, "episodes": len(episodes),
               "episodes_written": len(after["episodes"]), "seconds": seconds, "rows_per_s": rate(n, seconds),
               "bytes_before": bytes_before, "bytes_after": after["total_bytes"],
               "bytes_per_key": after["bytes_per_key"], "warnings": notes}
    if fps is not None:
        summary["fps"] = fps
    if args.gop is not None:
        summary["gop"] = args.gop
    if args.src_format is not None:
        summary["from"] = args.src_format
    if [tuple(e) for e in after["episodes"]] != [tuple(e) for e in episodes]:
        raise CLIError(f"the episodes of {dst} ({after['episodes'][:5]} ...) differ from those of {src} "
                       f"({episodes[:5]} ...)")
    if args.json:
        print_json(summary)
    else:
        print(f"converted {src} -> {dst} ({args.layout}): {n} rows, {len(episodes)} episodes in {seconds:.2f} s "
              f"({summary['rows_per_s']:,.0f} rows/s)")
        print(f"  {human_bytes(summary['bytes_before'])} -> {human_bytes(summary['bytes_after'])} on disk")
    return 0
