#!/usr/bin/env bash
# The Appendix C experiment on a CPU: build the small vision-language model (SmolLM2-135M-Instruct + a 12-block
# vision tower, SmolVLM's architecture), then remove each vision block and each language block in turn and score
# each pruned model on builtin-shapes (Figure 10); both under the shared heavy-job lock.
#   bash experiments/cpu-vlm-appendix-c/run.sh            # model in $DEPTHLAB_CACHE/experiments/vlm-shapes
#   BUILD=0 LIMIT=36 bash experiments/cpu-vlm-appendix-c/run.sh   # the per-block study only, on 36 items
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ "${BUILD:-1}" = 1 ]; then
  flock /tmp/depthlab-heavy.lock python3 "$here/build_vlm.py" "$@"
fi
flock /tmp/depthlab-heavy.lock python3 "$here/per_block.py" ${LIMIT:+--limit "$LIMIT"}
