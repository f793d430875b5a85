"""The ``depthlab`` command. Thin: parse -> call the library -> print.

Each subcommand lives in its own module here and exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (called with the parsed args, returns an exit code or None). Modules are
discovered automatically, so adding a command touches no shared file.

Every failure goes through one path (:func:`main`): one line on stderr naming the command, exit code
2 (``-v`` also prints the traceback of an unexpected one), third-party chatter silenced. An output
directory is checked before the command runs, and removed again if the command created it and then
failed (see ``_outputs``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pickle
import pkgutil
import sys
import traceback
import warnings

from depthlab.base.errors import UNSAFE_PICKLE, DepthlabError, first_line
from depthlab.base.paths import check_local_target
from depthlab.cli._options import apply_config_file
from depthlab.cli._outputs import OutputGuard


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    import depthlab  # light: its names load on first use

    parser = _Parser(
        prog="depthlab",
        description="Measure the Curse of Depth in transformer LMs and cure it with LayerNorm Scaling.",
    )
    parser.add_argument("--version", action="version", version=f"depthlab {depthlab.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.set_defaults(argv=None)  # main() records the arguments here, for provenance.command_line
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s" if not args.verbose else "%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.verbose:
        logging.getLogger("depthlab").setLevel(logging.DEBUG)  # ours; matplotlib's font search stays at INFO
    else:
        _quiet_third_parties()
    guard = None
    try:
        apply_config_file(args)  # --config FILE: what the command line left unset
        check_local_target(getattr(args, "target", None))  # a mistyped path: one line now, no hub look-up
        guard = OutputGuard.for_args(args)
        code = args.func(args)
    except KeyboardInterrupt:
        print(f"depthlab {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the one error path of the command line
        if args.verbose and not isinstance(err, DepthlabError):
            traceback.print_exc()  # -v: the traceback too, then the same clean-up, line and exit code
        if guard is not None:
            guard.cleanup()
        print(f"depthlab {args.command}: error: {_one_line(err, args.verbose)}", file=sys.stderr)
        return 2
    if code == 2 and guard is not None:
        guard.cleanup()
    return int(code or 0)


def _one_line(err: BaseException, verbose: bool = False) -> str:
    """What went wrong, in one line: a DepthlabError's message; the path and reason of an OSError;
    otherwise the exception's type and first line."""
    if isinstance(err, DepthlabError):
        return first_line(err)
    if isinstance(err, OSError) and err.strerror:
        where = f"{err.filename!r}: " if err.filename else ""
        return f"{where}{err.strerror}"
    if isinstance(err, pickle.UnpicklingError):
        return UNSAFE_PICKLE
    return f"{type(err).__name__}: {first_line(err)[:300]}" + ("" if verbose else " (run with -v for the traceback)")


def _quiet_third_parties() -> None:
    """transformers / huggingface_hub / datasets warnings and advisories off (errors still reach us)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # its own level, set when it is imported: retry lines off
    if not sys.stderr.isatty():  # loading / writing bars (transformers, huggingface_hub): on a terminal only
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when they are imported
        if "transformers" in sys.modules:  # imported already (in-process callers): switched off where it reads it
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
    for name in ("transformers", "huggingface_hub", "datasets", "tokenizers", "safetensors"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(torch|transformers|huggingface_hub)\b")


def run() -> None:
    sys.exit(main())
