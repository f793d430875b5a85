"""``python3 -m depthlab.data.opencorpus``: build the open-english corpus (see the package docstring)."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

USAGE = """\
examples:
  python3 -m depthlab.data.opencorpus                     # build into $DEPTHLAB_CACHE or ~/.cache/depthlab
  python3 -m depthlab.data.opencorpus --toy               # dry run: tiny offline corpus in a temp dir
  python3 -m depthlab.data.opencorpus --verify            # check every part's sha256
  depthlab train --preset llama-130m --data open-english --out runs/pre

A rerun reuses what is built (checksums verified). Copy <cache>/corpora/open-english/shards/ to
another machine (parts of at most --part-mib MiB) and give that directory as --data there.
"""


def parse(argv: list[str] | None) -> argparse.Namespace:
    from depthlab.data.opencorpus.sources import SOURCE_NAMES

    p = argparse.ArgumentParser(prog="python3 -m depthlab.data.opencorpus", description=__doc__, epilog=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="corpus directory (default <cache>/corpora/open-english; --toy: a new temp dir)")
    p.add_argument("--cache-dir", help="cache (default $DEPTHLAB_CACHE or ~/.cache/depthlab)")
    p.add_argument("--sources", default=",".join(SOURCE_NAMES), help="comma-separated subset (default: all)")
    p.add_argument("--tokenizer", help="bpe:N | bytes | hf:NAME (default bpe:16384; --toy: bpe:512)")
    p.add_argument("--part-mib", type=float, help="largest part file in MiB (default 48; --toy: 1/16)")
    p.add_argument("--val-fraction", type=float, default=0.02, help="held-out share of documents (default 0.02)")
    p.add_argument("--seed", type=int, default=0, help="seeds the held-out split and document order (default 0)")
    p.add_argument("--toy", action="store_true", help="dry run: the Bible's six books + planted duplicates, offline")
    p.add_argument("--verify", action="store_true", help="only verify the built parts' checksums")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    from depthlab.data.opencorpus.build import BuildOptions, MiB, build, toy_options, verify

    kw = {k: v for k, v in (("tokenizer", args.tokenizer),
                            ("part_bytes", None if args.part_mib is None else int(args.part_mib * MiB))) if v is not None}
    common = {"val_fraction": args.val_fraction, "seed": args.seed, **kw}
    if args.toy:
        opts = toy_options(Path(args.out or tempfile.mkdtemp(prefix="depthlab-toy-corpus-")), **common)
    else:
        opts = BuildOptions(out=Path(args.out) if args.out else None, cache_dir=args.cache_dir,
                            sources=tuple(s for s in args.sources.split(",") if s), **common)
    if args.verify:
        bad = verify(opts.root / "shards")
        print("\n".join(bad) or f"{opts.root / 'shards'}: every part matches its sha256")
        return 1 if bad else 0
    t0 = time.time()
    meta = build(opts)
    parts = [p for ps in meta["parts"].values() for p in ps]
    print(f"{opts.root / 'shards'}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} held-out tokens "
          f"({meta['tokenizer']}), {len(parts)} parts of at most {max(p['bytes'] for p in parts) / MiB:.1f} MiB, "
          f"{'reused (checksums verified)' if meta['reused'] else 'built'} in {time.time() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    from depthlab.base.errors import DepthlabError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return run(parse(argv))
    except DepthlabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
