"""What ``--weights`` and ``--dtype`` mean, decided in one place for every command and the library.

    decide_precision("cpu", weights="bf16")     # ("bf16", "fp32"): bf16 weights, each linear upcast while it computes
    decide_precision("cuda")                    # ("bf16", "bf16")
    resolve_precision(device, "auto", "auto")   # the same as torch dtypes: (weights, compute)

Two settings, one choice set (:data:`PRECISIONS`) on every command:

* ``--weights``: the dtype the weights are held in (memory, and what a checkpoint or export stores);
* ``--dtype``: the compute precision, the dtype the arithmetic runs in (train / finetune / compare / demo: bf16
  autocast over fp32 weights, or bf16 weights' own arithmetic; diagnose / evaluate / prune: the forward passes).

``auto`` weights are the command's own default (:func:`decide_precision`'s ``auto_weights``; bf16 whenever the
compute is bf16). ``auto`` compute is the weights' dtype, except bf16 weights on a CPU, which compute in fp32 one
linear layer at a time: a CPU without bf16 instructions takes a slow path for bf16 matmuls (on this project's
AVX2 AMD EPYC, an 8B-shaped layer 28.4 s in bf16 against 10.1 s upcast; benchmarks/results/
streamed_bf16_vs_fp32_cpu.json). Names only here; torch is imported inside the functions that return its dtypes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from depthlab.base.errors import DepthlabError, choices

if TYPE_CHECKING:
    import torch

#: The one choice set of --weights and --dtype.
PRECISIONS = ("auto", "fp32", "bf16")

#: --dtype on the commands that measure a loaded model (diagnose, evaluate, prune).
DTYPE_HELP = ("compute precision: auto (the weights' dtype; bf16 weights on a CPU compute in fp32, each linear layer "
              "upcast while it runs) | fp32 | bf16 (needs bf16 weights)")

#: --weights, after "weight dtype: auto (", on those commands; each names its own automatic choice.
WEIGHTS_HELP = "weight dtype: auto ({auto}; bf16 with --dtype bf16) | fp32 | bf16 (half the memory)"


def check_precision(flag: str, value: str) -> str:
    """``value`` if it is one of :data:`PRECISIONS`, else DepthlabError naming ``flag`` and the choices."""
    if value not in PRECISIONS:
        raise DepthlabError(f"unknown {flag} {value!r}; {choices(PRECISIONS)}")
    return value


def default_compute(device_type: str, weights: str) -> str:
    """The automatic compute precision for ``weights`` ("fp32" | "bf16") on a device of ``device_type``."""
    return "fp32" if device_type == "cpu" and weights == "bf16" else weights


def decide_precision(device_type: str, weights: str = "auto", compute: str = "auto",
                     auto_weights: str | None = None) -> tuple[str, str]:
    """``(weights, compute)``, each "fp32" or "bf16", that ``--weights weights --dtype compute`` mean on a device of
    ``device_type``. ``auto_weights``: the command's automatic weights (None: bf16 on a GPU, fp32 elsewhere).
    bf16 arithmetic from fp32 weights is refused in one line: give bf16 weights for it."""
    check_precision("--weights", weights)
    check_precision("--dtype", compute)
    if compute == "bf16" and weights == "fp32":
        raise DepthlabError("--dtype bf16 computes in bf16, which here needs bf16 weights; give --weights bf16 "
                            "(or --dtype fp32 / auto with --weights fp32)")
    if weights == "auto":
        weights = "bf16" if compute == "bf16" else auto_weights or ("bf16" if device_type == "cuda" else "fp32")
    return weights, default_compute(device_type, weights) if compute == "auto" else compute


def torch_dtype(name: str) -> torch.dtype:
    """"fp32" / "bf16" (and "fp16") as a torch dtype."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def resolve_precision(device: torch.device, weights: str = "auto", compute: str = "auto",
                      auto_weights: str | None = None) -> tuple[torch.dtype, torch.dtype]:
    """:func:`decide_precision` on ``device``, as torch dtypes ``(weights, compute)``."""
    w, c = decide_precision(device.type, weights, compute, auto_weights)
    return torch_dtype(w), torch_dtype(c)


def default_compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The automatic compute dtype of weights held in ``dtype`` on ``device`` (:func:`default_compute`; a dtype
    other than fp32 / bf16 computes in itself)."""
    import torch

    name = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype)
    return dtype if name is None else torch_dtype(default_compute(device.type, name))
