#!/usr/bin/env bash
# The regime grid of issue 47 as far as a CPU allows (README.md says what ran and what did not).
# Tokens per step are held at 1,024 (8 x 128, 2 x 512 or 1 x 1024), so every sequence length sees the same tokens.
# Every invocation resumes: the same command on the same --out skips finished runs, and a compare may grow by
# schemes, seeds and sweep values. Order = priority (PHASES picks): 1 the regime expected to favour the third
# claim (weight decay 0.1, the longest sequence, AdamW and Muon, CompleteP as the third scheme), seed 0; 2 its
# second seed for Pre-LN and LNS; 3 the second seed of the weight-decay-0.1 cells of length 512 and 128; 4 the
# second seed of the weight-decay-0 cells; 5 CompleteP's second seed at length 1024; 6 CompleteP in the shorter cells;
# 7 the cells of issue 47's grid the others leave out (AdamW at weight decay 0 and length 1024; Muon at length 128 and
# at weight decay 0), every scheme and both seeds.
# max_seq_len is 512 for the cells of length <= 512 and 1024 for the others; it changes no parameter and no
# initial weight (RoPE is computed on the fly; checked: equal state dicts at the same seed), only the config,
# so the length-1024 cells have their own --out directories.
set -euo pipefail
OUT=${OUT:-/tmp/regime}
JOBS=${JOBS:-1}
PHASES=${PHASES:-1 2 3 4 5 6 7}
SHORT=${SHORT:-512 128}  # the lengths short() runs; SHORT=128: issue 47's grid alone (how open-english ran)
DATA=${DATA:-}  # empty: the built-in corpus (what ran); DATA=open-english OUT=/tmp/regime-oe: the same grid on it
BASE="--preset tiny --steps 200 --diag-tokens 8192 --no-diag-sublayers --no-diag-lens --no-jacobian --jobs $JOBS${DATA:+ --data $DATA}"

long() {  # $1 seeds, $2 schemes: AdamW and Muon at weight decay 0.1, length 1024
    for opt in adamw muon; do
        depthlab compare $BASE --schemes "$2" --seeds "$1" --set max_seq_len=1024 --optimizer $opt \
            --weight-decay 0.1 --seq-len 1024 --batch-size 1 --diag-seq-len 1024 --out "$OUT/$opt-seq1024-wd0.1"
    done
}

short() {  # $1 seeds, $2 schemes, $3 the weight decays of the AdamW cells: the cells of length 512 and 128
    local common="$BASE --schemes $2 --seeds $1 --set max_seq_len=512"
    if [[ " $SHORT " == *" 512 "* ]]; then
        depthlab compare $common --optimizer muon --weight-decay 0.1 --seq-len 512 --batch-size 2 --diag-seq-len 512 \
            --out "$OUT/muon-seq512-wd0.1"
        depthlab compare $common --optimizer adamw --seq-len 512 --batch-size 2 --diag-seq-len 512 \
            --sweep weight_decay="$3" --out "$OUT/adamw-seq512"
    fi
    depthlab compare $common --optimizer adamw --seq-len 128 --batch-size 8 --diag-seq-len 128 \
        --sweep weight_decay="$3" --out "$OUT/adamw-seq128"
}

rest() {  # $1 seeds, $2 schemes: the cells of issue 47's grid (wd {0, 0.1} x length {128, 1024} x AdamW / Muon) not above
    depthlab compare $BASE --schemes "$2" --seeds "$1" --set max_seq_len=1024 --optimizer adamw --weight-decay 0 \
        --seq-len 1024 --batch-size 1 --diag-seq-len 1024 --out "$OUT/adamw-seq1024-wd0"
    depthlab compare $BASE --schemes "$2" --seeds "$1" --set max_seq_len=512 --optimizer muon --seq-len 128 \
        --batch-size 8 --diag-seq-len 128 --sweep weight_decay=0.1,0 --out "$OUT/muon-seq128"
    depthlab compare $BASE --schemes "$2" --seeds "$1" --set max_seq_len=1024 --optimizer muon --weight-decay 0 \
        --seq-len 1024 --batch-size 1 --diag-seq-len 1024 --out "$OUT/muon-seq1024-wd0"
}

for phase in $PHASES; do
    case $phase in
        1) long 0 pre,lns,completep ;;
        2) long 0,1 pre,lns ;;
        3) short 0,1 pre,lns 0.1 ;;
        4) short 0,1 pre,lns 0.1,0 ;;
        5) long 0,1 pre,lns,completep ;;
        6) short 0,1 pre,lns,completep 0.1,0 ;;
        7) rest 0,1 pre,lns,completep ;;
    esac
done
