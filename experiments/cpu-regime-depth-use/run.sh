#!/usr/bin/env bash
# The regime grid of issue 47 as far as this session's CPU allowed (README.md says what ran and what did not).
# Tokens per step are held at 1,024 (8 x 128 or 2 x 512), so the two sequence lengths see the same tokens.
# Every invocation resumes: the same command on the same --out skips finished runs. First the regime expected to
# favour the third claim (weight decay 0.1, the longer sequences), then the others; seed 0 of every cell first,
# SEEDS=0,1 then adds the second seed to each.
set -euo pipefail
OUT=${OUT:-/tmp/regime}
SEEDS=${SEEDS:-0}
COMMON="--schemes pre,lns --preset tiny --steps 200 --set max_seq_len=512 --seeds $SEEDS --diag-tokens 8192
        --no-diag-sublayers --no-diag-lens --no-jacobian --jobs 2"
depthlab compare $COMMON --optimizer adamw --seq-len 512 --batch-size 2 --diag-seq-len 512 \
    --sweep weight_decay=0.1,0 --out "$OUT/adamw-seq512"
depthlab compare $COMMON --optimizer adamw --seq-len 128 --batch-size 8 --diag-seq-len 128 \
    --sweep weight_decay=0.1,0 --out "$OUT/adamw-seq128"
depthlab compare $COMMON --optimizer muon --weight-decay 0.1 --seq-len 512 --batch-size 2 --diag-seq-len 512 \
    --out "$OUT/muon-seq512-wd0.1"
