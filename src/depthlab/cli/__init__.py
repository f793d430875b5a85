"""The ``depthlab`` command. Thin: parse -> call the library -> print.

Each subcommand lives in its own module here and exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (called with the parsed args, returns an exit code or None). Modules are
discovered automatically, so adding a command touches no shared file.

Bad input (``DepthlabError``, a missing file) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from depthlab.errors import DepthlabError, first_line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    import depthlab

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
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s" if not args.verbose else "%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code = args.func(args)
    except (DepthlabError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as err:
        print(f"depthlab {args.command}: error: {first_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"depthlab {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


def run() -> None:
    sys.exit(main())
