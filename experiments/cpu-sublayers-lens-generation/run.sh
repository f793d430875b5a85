#!/usr/bin/env bash
# The measurements of README.md, in order. OUT: where the runs go (default /tmp/sublayer-exp).
set -euo pipefail
OUT=${OUT:-/tmp/sublayer-exp}
COMMON=(--data builtin --tokens 1024 --seq-len 256 --batch-size 8 --latency-tokens 8 --no-progress
        --generate builtin-arith --generate-limit 24)
# 1. SmolLM2-135M: 4 blocks removed (Gromov et al.'s angular choice), generative exact match before and after
depthlab prune smollm2 --remove 4 --method angular-block "${COMMON[@]}" --out "$OUT/smollm2-block4"
# 2. attention sublayers (8 of 30: half the parameters of 4 blocks), LLM-Drop's similarity (angular)
depthlab prune smollm2 --unit attn --remove 8 --method angular-block "${COMMON[@]}" --out "$OUT/smollm2-attn8"
# 3. tiny Pre-LN vs LNS trained briefly: sublayers, lens, gradient norms over training
depthlab compare --schemes pre,lns --preset tiny --data builtin --steps 64 --batch-size 8 --eval-tokens 4096 \
  --diag-tokens 2048 --variance-every 8 --jobs 2 --out "$OUT/tiny-pre-lns"
# 4. SmolLM2's diagnosis: attention vs MLP per block, the logit lens
depthlab diagnose smollm2 --data builtin --tokens 512  --seq-len 256 --batch-size 2 --no-jacobian --no-progress \
  --out "$OUT/smollm2-diagnose"
