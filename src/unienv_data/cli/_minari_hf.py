"""The Minari and Hugging Face `datasets` hooks of `unienv-data convert` (`--from minari|hf`, `--to minari`).

Openers (`open_minari`, `open_hf`) turn SRC into a `BatchSource` that `convert` copies into the native layout like
any dataset it reads; the exporter (`export_minari`) writes a Minari folder from a dataset `convert` opened.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Dict

from ._batch_source import BatchSource
from ._common import CLIError


def add_minari_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `--from minari` / `--to minari`."""
    g = p.add_argument_group("Minari (--from minari / --to minari)")
    g.add_argument("--minari-format", choices=("hdf5", "arrow"), default=None,
                   help="--to minari: the data format to write (default hdf5)")
    g.add_argument("--dataset-id", default=None,
                   help="--to minari: the Minari dataset id (default: DST's folder name, with -v0 added when it has "
                        "no version); minari.load_dataset(ID) finds it when DST is MINARI_DATASETS_PATH/ID")
    g.add_argument("--final-observation", choices=("next", "repeat"), default=None,
                   help="--to minari: where each episode's last observation comes from: the last "
                        "next_observations row (default), or the last observation repeated")
    p.add_argument_group("Hugging Face (--from hf)").add_argument(
        "--episode-column", default="auto",
        help="--from hf: the integer column whose runs of equal values are episodes (default: episode_index when "
             "the dataset has it; 'none' for no episodes)")
    g.add_argument("--no-next-obs", action="store_true",
                   help="--from minari: leave out next_observations (the observation after each step); the last "
                        "observation of every episode is then not copied")


def open_minari(path: str, backend: Any, args: argparse.Namespace) -> BatchSource:
    """A Minari folder (HDF5 or Arrow) as a source; rows carry `next_observations` unless `--no-next-obs`."""
    from unienv_data.integrations.minari import MinariAsUniEnvDataset
    keep_next = not getattr(args, "no_next_obs", False)
    batch = MinariAsUniEnvDataset.from_local(path, backend=backend, include_next_observations=keep_next)
    version = batch.dataset_metadata.get("minari_version")
    return BatchSource(batch, path, f"Minari ({batch.data_format})",
                       format_version=None if version is None else str(version))


def open_hf(path: str, backend: Any, args: argparse.Namespace) -> BatchSource:
    """A Hugging Face dataset saved with `save_to_disk` as a source; its episodes are the runs of
    `--episode-column` (default: `episode_index` when there is one), else it has none."""
    try:
        import datasets
    except ImportError as exc:
        raise CLIError(f"--from hf needs the `datasets` package: pip install 'unienv-storage[huggingface]' ({exc})") \
            from None
    from unienv_data.integrations.huggingface import HFAsUniEnvDataset
    try:
        ds = datasets.load_from_disk(path)
    except FileNotFoundError as exc:
        raise CLIError(f"{path} is not a dataset saved with datasets' save_to_disk ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        if len(ds) != 1:
            raise CLIError(f"{path} holds the splits {sorted(ds)}; convert one split folder ({path}/<split>)")
        ds = next(iter(ds.values()))
    column = getattr(args, "episode_column", "auto")
    if column == "auto":
        column = "episode_index" if "episode_index" in ds.column_names else None
    elif column == "none":
        column = None
    try:
        batch = HFAsUniEnvDataset.create(ds, backend, episode_column=column)
    except (KeyError, ValueError) as exc:
        raise CLIError(f"--from hf: {exc}") from None
    return BatchSource(batch, path, "Hugging Face datasets")


def export_minari(src: Any, dst: str, args: argparse.Namespace, progress: Callable[[int], None]) -> Dict[str, Any]:
    """Writes the opened dataset `src` as a Minari folder at `dst` (see `integrations.minari_export`)."""
    from unienv_data.integrations.minari_export import write_minari
    from ._lerobot import _parse_map
    if args.lossless or args.crf is not None or args.codec != "auto":
        raise CLIError("--codec, --lossless and --crf do not apply to --to minari (Minari keeps images as arrays)")
    try:
        return write_minari(src, dst, dataset_id=args.dataset_id, data_format=args.minari_format or "hdf5",
                            final_observation=args.final_observation or "next", chunk=args.chunk, progress=progress,
                            keys=_parse_map(args.map), exclude=args.exclude)
    except (ValueError, TypeError) as exc:
        raise CLIError(f"--to minari: {exc}") from None


def is_minari_folder(path: str) -> bool:
    from unienv_data.integrations._minari_format import is_minari_dir
    return os.path.isdir(path) and is_minari_dir(path)


__all__ = ["add_minari_arguments", "open_minari", "open_hf", "export_minari", "is_minari_folder"]
