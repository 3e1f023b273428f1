"""`unienv-data`: the command-line tool (also `python -m unienv_data`).

Commands (each has `--help`):

* `demo --out DIR`: record synthetic robot episodes with the native layout, reopen, sample, summarise, preview;
* `info PATH`: space tree, storage per key, capacity, length, segments, bytes per key, format versions;
* `verify PATH`: metadata, file sizes, every row readable, checksums where present (exit 1 on damage);
* `plot PATH`: PNG charts of episode lengths and value ranges, and a contact sheet of camera frames
  (`info`, `verify` and `plot` also read a LeRobot or Minari dataset folder);
* `stats PATH`: per-key mean, std, min, max and quantiles, written beside the dataset as `stats.json`;
* `convert SRC DST --layout {flattened,native,native-video}`: rewrite a dataset, streaming, segments kept (also
  `--from {hf,lerobot,minari}` and `--to {lerobot,minari}`);
* `export-video PATH KEY OUT.mp4`: one camera key as a video file.

Exit codes: 0 success; 1 failure or damage found (the message names the file); 2 bad command line.
Importing this package imports no optional library: each command imports what it needs when it runs and says
which package (or extra) to install when it is missing.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from ._common import CLIError

COMMANDS = ("demo", "info", "verify", "plot", "stats", "convert", "export_video")


def build_parser() -> argparse.ArgumentParser:
    from importlib import import_module
    from unienv_data import __version__
    parser = argparse.ArgumentParser(
        prog="unienv-data", description="Look inside, check, plot and convert unienv trajectory datasets.",
        epilog="Run 'unienv-data <command> --help' for the options of a command. Exit codes: 0 success, "
               "1 failure or damage found, 2 bad command line.")
    parser.add_argument("--version", action="version", version=f"unienv-data {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE before the command (repeatable), so that the storage classes it "
                             "registers with unienv_data.base.register_storage can be opened; give it before the "
                             "command, e.g. 'unienv-data --import my_storages verify PATH'")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name in COMMANDS:
        import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Runs the command line `argv` (default: `sys.argv[1:]`); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return 2
    code = _import_plugins(args.imports, args.debug)
    if code:
        return code
    try:
        code = int(args.run(args))
        sys.stdout.flush()          # inside the try: a reader that went away is handled below, not at exit
        return code
    except CLIError as exc:
        if args.debug:
            raise
        print(f"unienv-data {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:
        # the reader went away (`unienv-data info PATH | head`): stop quietly, as a shell tool does; stdout goes to
        # the null device so that flushing it at exit does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
    except (OSError, ValueError, KeyError, ImportError) as exc:
        if args.debug:
            raise
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"unienv-data {args.command}: error: {type(exc).__name__}: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"unienv-data {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - anything else (damage nobody foresaw): a message, not a traceback
        if args.debug:
            raise
        print(f"unienv-data {args.command}: error: {type(exc).__name__}: {exc} (rerun with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


def _import_plugins(modules: List[str], debug: bool) -> int:
    """Imports the `--import` modules in order (their `register_storage` calls run); 0, or the exit code after an
    error message: 2 for a module that cannot be found, 1 for one that raised while being imported."""
    from importlib import import_module
    for name in modules:
        try:
            import_module(name)
        except ImportError as exc:
            if debug:
                raise
            print(f"unienv-data: error: --import {name}: cannot import it ({type(exc).__name__}: {exc}); the "
                  "module must be installed or on PYTHONPATH", file=sys.stderr)
            return 2
        except Exception as exc:  # noqa: BLE001 - the plugin's own failure: a message, not a traceback
            if debug:
                raise
            print(f"unienv-data: error: --import {name}: importing it raised {type(exc).__name__}: {exc} (rerun "
                  "with --debug for the traceback)", file=sys.stderr)
            return 1
    return 0


__all__ = ["main", "build_parser", "CLIError"]
