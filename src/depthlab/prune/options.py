"""What ``prune`` removes, how it chooses and how it heals: plain data, no torch (the command line derives its
flags from it)."""

from __future__ import annotations

from dataclasses import dataclass, field

METHODS = ("removal", "angular-block", "influence")  # how blocks are chosen (depthlab.prune.select)
HEAL_MODES = ("full", "lora")


@dataclass
class HealOptions:
    """Short continued training of a pruned model (all weights, or LoRA adapters merged back)."""

    data: str = "builtin"  # a depthlab data spec; its train split is used
    steps: int = 0  # continued-training steps after pruning (0: no healing)
    mode: str = "full"  # train all weights, or LoRA adapters (needs peft): full | lora
    lr: float = 1e-4  # AdamW learning rate
    batch_size: int = 8  # sequences per healing step
    seq_len: int = 256  # tokens per healing sequence
    warmup: int = 10  # steps of linear warm-up
    lora_rank: int = 16  # rank of the LoRA adapters
    seed: int = 0  # data order and adapter init
    progress: bool = True  # a progress bar


@dataclass
class PruneOptions:
    """Which blocks go (exactly one of ``remove``, ``budget``, ``blocks``), chosen how, on what text."""

    # ---- what to remove
    method: str = "removal"  # how to choose blocks (ignored with blocks): removal | angular-block | influence
    remove: int | None = None  # remove N blocks
    budget: float | None = None  # or: the most blocks within this many nats of extra held-out loss
    blocks: list[int] | None = None  # or: exactly these blocks (1-based), e.g. 21,22,23
    # ---- data
    data: str = "builtin"  # text: its val split chooses and evaluates, its train split heals
    tokens: int = 2048  # held-out tokens
    seq_len: int = 256  # tokens per sequence
    batch_size: int = 8  # sequences per forward
    heal: HealOptions = field(default_factory=HealOptions)  # healing after the surgery
    latency_tokens: int = 16  # new tokens generated for the latency measurement
    progress: bool = True  # progress bars
    # ---- engine
    stream: bool | None = None  # read the model layer by layer (no healing, no latency); default: when it exceeds free memory
