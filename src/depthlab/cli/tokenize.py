"""``depthlab tokenize``: tokenize a corpus once into token shards for training on large data."""

from __future__ import annotations

import argparse

USAGE = """\
examples:
  depthlab tokenize --data corpus/ --tokenizer bpe:8192 --out shards/corpus
  depthlab train --data shards/corpus --out runs/pre      # memory-maps shards/corpus/{train,val}.bin

Writes OUT/train.bin and OUT/val.bin (uint16 when the vocabulary fits, else uint32; documents
separated by EOS), OUT/tokenizer/ and OUT/shards.json. The held-out split is the data's own.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("tokenize", help="tokenize a corpus into token shards (uint16/uint32 memmap)",
                              description=__doc__ + "\n\n" + USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="builtin | file | dir | glob | hf:NAME[:CONFIG]")
    p.add_argument("--tokenizer", default="bpe:4096", help="bytes | bpe:N | hf:NAME_OR_PATH (default bpe:4096)")
    p.add_argument("--text-field", default="text", help="text field of .jsonl/.parquet/hf data")
    p.add_argument("--out", required=True, help="output directory (must not exist)")
    p.add_argument("--cache-dir", help="tokenizer cache (default $DEPTHLAB_CACHE or ~/.cache/depthlab)")
    p.set_defaults(func=run)


def run(args) -> int:

    from depthlab.base.errors import DepthlabError
    from depthlab.base.fileio import fresh_out, publish_dir
    from depthlab.base.provenance import command_line
    from depthlab.data import build_tokenizer, check_tokenizer_spec, iter_documents, write_shards

    fresh_out(args.out)
    check_tokenizer_spec(args.tokenizer)
    iter_documents(args.data, "train", args.text_field)
    texts = iter_documents(args.data, "train", args.text_field) if args.tokenizer.startswith("bpe:") else None
    tok = build_tokenizer(args.tokenizer, texts, cache_dir=args.cache_dir)
    with publish_dir(args.out) as tmp:  # --out appears whole or not at all (a full disk leaves nothing behind)
        meta = write_shards(args.data, tok, tmp, args.text_field, command=command_line(args.argv))
        if not meta["train_tokens"]:
            raise DepthlabError(f"--data {args.data!r} holds no text to tokenize")
    print(f"{args.out}: {meta['train_tokens']} train + {meta['val_tokens']} val tokens ({meta['dtype']}, {tok.spec})")
    return 0
