"""`unienv-data export-video PATH KEY OUT.mp4`: one camera key of a dataset as a video file (PyAV).

Frames are read in dataset order (oldest first), `--chunk` at a time, and encoded as they come: every episode one
after the other, or only `--episode N` (0 = the oldest). The container follows OUT's extension (.mp4, .mkv,
.mov); the codec is `--codec` (default H.264, `libx264`, falling back to MPEG-4 where the build lacks it) at
`--fps` frames per second (default: the fps of a VideoStorage key, else 15). Odd frame sizes are padded by one
pixel (H.264 with yuv420p needs even sizes); gray frames are written as RGB.
"""
from __future__ import annotations

import argparse
import os
from fractions import Fraction
from typing import Any, List, Optional, Tuple

import numpy as np

from ._common import CLIError, Progress, add_backend_flag, add_output_flags, human_bytes, optional_import, print_json
from ._images import to_rgb


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export-video", help="write one camera key as a video file",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="PATH", help="dataset directory")
    p.add_argument("key", metavar="KEY", help="camera key, e.g. obs/camera ('.' works as the separator too)")
    p.add_argument("out", metavar="OUT", help="video file to write (.mp4, .mkv or .mov)")
    p.add_argument("--episode", type=int, default=None, help="only this episode (0 = oldest; negative from the end)")
    p.add_argument("--fps", type=float, default=None, help="frames per second (default: the stored fps, else 15)")
    p.add_argument("--codec", default="libx264", help="encoder (default libx264; mpeg4 is the fallback)")
    p.add_argument("--crf", type=int, default=18, help="quality for libx264 (lower is better; default 18)")
    p.add_argument("--chunk", type=int, default=256, help="frames read at a time (default 256)")
    add_backend_flag(p)
    add_output_flags(p)
    p.set_defaults(run=run)


_CONTAINERS = {".mp4": "mp4", ".mkv": "matroska", ".mov": "mov"}


def _open_encoder(av: Any, out: str, codec: str, fps: Fraction, width: int, height: int, crf: int
                  ) -> Tuple[Any, Any, str]:
    ext = os.path.splitext(out)[1].lower()
    if ext not in _CONTAINERS:
        raise CLIError(f"OUT must end in one of {sorted(_CONTAINERS)}, got {out!r}")
    tried: List[str] = []
    for name in dict.fromkeys([codec, "mpeg4"]):
        container = av.open(out, mode="w", format=_CONTAINERS[ext])
        try:
            stream = container.add_stream(name, rate=fps)
            stream.width, stream.height = width, height
            stream.pix_fmt = "yuv420p"
            if name in ("libx264", "libx265"):
                stream.options = {"crf": str(crf), "preset": "veryfast"}
            stream.codec_context.open()
            return container, stream, name
        except Exception as exc:  # noqa: BLE001 - try the fallback, then report every reason
            tried.append(f"{name}: {type(exc).__name__}: {exc}")
            container.close()
    raise CLIError("no encoder could be opened: " + "; ".join(tried))


def run(args: argparse.Namespace) -> int:
    from unienv_data.inspect import open_dataset
    av = optional_import("av", "export-video", "av (PyAV)", "video")
    from unienv_data.storages._video_codec import SVT_LOG_LEVEL
    os.environ.setdefault("SVT_LOG", SVT_LOG_LEVEL)             # SVT-AV1's settings log, see _video_codec
    if args.chunk < 1:
        raise CLIError("--chunk must be at least 1")
    out = os.path.abspath(args.out)
    with open_dataset(args.path, backend=args.backend) as ds:
        key = args.key if args.key in ds.leaf_spaces else args.key.replace(".", "/")
        images = ds.image_keys()
        if key not in ds.leaf_spaces:
            raise CLIError(f"no key {args.key!r} in the dataset; camera keys: {images or 'none'}; all keys: "
                           f"{sorted(ds.leaf_spaces)}")
        if key not in images:
            raise CLIError(f"key {key!r} does not hold camera frames (uint8 (H, W[, C])); camera keys: "
                           f"{images or 'none'}")
        start, end = 0, len(ds)
        episodes = ds.episodes()
        if args.episode is not None:
            if not episodes:
                raise CLIError("the dataset records no episodes; omit --episode")
            if not -len(episodes) <= args.episode < len(episodes):
                raise CLIError(f"--episode {args.episode} is out of range: the dataset has {len(episodes)} episodes")
            start, end = episodes[args.episode]
        if end <= start:
            raise CLIError("no frames to export")
        fps = Fraction(args.fps).limit_denominator(1001) if args.fps else Fraction(_stored_fps(ds, key) or 15)
        shape = tuple(int(d) for d in ds.leaf_spaces[key].shape)
        h, w = shape[0], shape[1]
        H, W = h + h % 2, w + w % 2
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        container, stream, codec = _open_encoder(av, out, args.codec, fps, W, H, args.crf)
        frames = 0
        try:
            with Progress(end - start, "encoding", "frames", enabled=not args.quiet) as bar:
                for s in range(start, end, args.chunk):
                    idx = np.arange(s, min(end, s + args.chunk), dtype=np.int64)
                    batch = ds.read_numpy(idx, [key])[key]
                    for f in batch:
                        rgb = to_rgb(f)
                        if (H, W) != (h, w):
                            rgb = np.pad(rgb, ((0, H - h), (0, W - w), (0, 0)), mode="edge")
                        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
                        for packet in stream.encode(frame):
                            container.mux(packet)
                        frames += 1
                    bar.update(idx.size)
            for packet in stream.encode(None):
                container.mux(packet)
        finally:
            container.close()
    summary = {"path": os.path.abspath(args.path), "key": key, "out": out, "frames": frames, "fps": float(fps),
               "codec": codec, "width": W, "height": H, "rows": [start, end], "bytes": os.path.getsize(out)}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {frames} frames of {key} ({W}x{H}, {codec}, {float(fps):g} fps) to {out} "
              f"({human_bytes(summary['bytes'])})")
    return 0


def _stored_fps(ds: Any, key: str) -> Optional[float]:
    for node in ds.root.iter():
        if node.kind == "VideoStorage" and key in node.leaves:
            fps = node.meta.get("fps")
            if isinstance(fps, (int, float)) and fps > 0:
                return float(fps)
    return None
