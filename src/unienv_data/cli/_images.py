"""Contact sheets of camera frames with Pillow (used by `demo` for its preview and by `plot`)."""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from ._common import optional_import

Row = Tuple[str, Sequence[Tuple[str, np.ndarray]]]


def _pil() -> Any:
    return optional_import("PIL.Image", "writing PNG images", "pillow", "video")


def to_rgb(frame: np.ndarray) -> np.ndarray:
    """(H, W), (H, W, 1), (H, W, 3) or (H, W, 4) uint8 as (H, W, 3) uint8."""
    f = np.asarray(frame)
    if f.dtype != np.uint8:
        f = np.clip(f, 0, 255).astype(np.uint8)
    if f.ndim == 2:
        f = f[:, :, None]
    if f.shape[-1] == 1:
        f = np.repeat(f, 3, axis=-1)
    return np.ascontiguousarray(f[:, :, :3])


def contact_sheet(rows: Sequence[Row], title: str = "", scale: int = 2) -> Any:
    """A grid image: one row per `(label, [(caption, frame), ...])`, frames scaled by `scale` (nearest)."""
    Image = _pil()
    ImageDraw = optional_import("PIL.ImageDraw", "writing PNG images", "pillow", "video")
    frames = [to_rgb(f) for _, items in rows for _, f in items]
    if not frames:
        raise ValueError("contact_sheet needs at least one frame")
    h = max(f.shape[0] for f in frames) * scale
    w = max(f.shape[1] for f in frames) * scale
    ncols = max(len(items) for _, items in rows)
    left, top, gap, caption = 64, (22 if title else 6), 4, 12
    width = left + ncols * (w + gap) + gap
    height = top + len(rows) * (h + caption + gap) + gap
    sheet = Image.new("RGB", (width, height), (250, 250, 250))
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((gap, 4), title, fill=(20, 20, 20))
    for r, (label, items) in enumerate(rows):
        y = top + r * (h + caption + gap)
        draw.text((4, y + h // 2 - 5), label, fill=(40, 40, 40))
        for c, (cap, frame) in enumerate(items):
            x = left + c * (w + gap)
            tile = Image.fromarray(to_rgb(frame)).resize((w, h), Image.NEAREST)
            sheet.paste(tile, (x, y))
            draw.text((x + 2, y + h + 1), cap, fill=(90, 90, 90))
    return sheet


def even_picks(start: int, end: int, n: int) -> List[int]:
    """Up to `n` indices spread evenly over `[start, end)`, first and last included."""
    length = end - start
    if length <= 0:
        return []
    if length <= n:
        return list(range(start, end))
    return sorted({start + int(round(i * (length - 1) / (n - 1))) for i in range(n)}) if n > 1 else [start]


def episode_sheet(dataset: Any, key: str, episodes: Sequence[Tuple[int, int]], max_rows: int = 6,
                  max_cols: int = 8, title: str = "", scale: int = 2) -> Any:
    """A contact sheet of `key` from `dataset` (an `OpenedDataset`): rows are episodes spread over the dataset,
    columns frames spread over each episode. Without episodes, rows are stretches of the whole dataset."""
    n = len(dataset)
    if not episodes:
        k = max(1, min(max_rows, n // max(1, max_cols)))
        bounds = [(i * n // k, (i + 1) * n // k) for i in range(k)]
        labels = [f"rows {s}-{e - 1}" for s, e in bounds]
    else:
        picks = even_picks(0, len(episodes), max_rows)
        bounds = [episodes[i] for i in picks]
        labels = [f"ep {i}" for i in picks]
    wanted = [even_picks(s, e, max_cols) for s, e in bounds]
    flat = np.asarray([i for w in wanted for i in w], dtype=np.int64)
    if flat.size == 0:
        raise ValueError("the dataset holds no rows to show")
    order = np.argsort(flat, kind="stable")
    frames = np.empty((flat.size,) + tuple(dataset.leaf_spaces[key].shape), dtype=np.uint8)
    frames[order] = dataset.read_numpy(flat[order], [key])[key]
    rows: List[Row] = []
    pos = 0
    for label, (s, _e), idx in zip(labels, bounds, wanted):
        rows.append((label, [(f"t={i - s}", frames[pos + j]) for j, i in enumerate(idx)]))
        pos += len(idx)
    return contact_sheet(rows, title=title, scale=scale)
