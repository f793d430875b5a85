#!/usr/bin/env bash
# The Appendix C experiment on a CPU: build the small vision-language model (SmolLM2-135M-Instruct + a 12-block
# vision tower, SmolVLM's architecture) under the shared heavy-job lock, then measure it.
#   bash experiments/cpu-vlm-appendix-c/run.sh            # model in $DEPTHLAB_CACHE/experiments/vlm-shapes
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
flock /tmp/depthlab-heavy.lock python3 "$here/build_vlm.py" "$@"
