"""What ``prune`` removes, how it chooses and how it heals: plain data, no torch (the command line derives its
flags from it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from depthlab.base.errors import MAX_TOKENS, DepthlabError, check_int, check_number, check_work, choices

METHODS = ("removal", "angular-block", "influence")  # how blocks are chosen (depthlab.prune.select)
UNIT_CHOICES = ("block", "attn", "mlp")  # what one removal takes out: a block, or one block's attention or MLP
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
    checkpoint: bool | None = None  # recompute activations in the backward (default: if they outweigh weights or 1/4 free memory)
    return_memory: bool = True  # give freed activations back to the system (glibc): ~2.5x less peak, ~1.5x step time
    progress: bool = True  # a progress bar

    def validate(self) -> None:
        """Refuse, in one line naming the flag and the value, what cannot work (before anything is loaded)."""
        if self.mode not in HEAL_MODES:
            raise DepthlabError(f"unknown --heal {self.mode!r}; {choices(HEAL_MODES)}")
        check_int("--heal-steps", self.steps, 0)
        check_number("--heal-lr", self.lr, above=0, maximum=1e6)
        check_int("--heal-batch-size", self.batch_size, 1)
        check_int("--seq-len", self.seq_len, 2)
        check_int("--heal-warmup", self.warmup, 0)
        check_int("--heal-lora-rank", self.lora_rank, 1)
        check_int("--heal-seed", self.seed, 0, 2**32 - 1)
        check_work(f"--heal-steps {self.steps} x --heal-batch-size {self.batch_size} x --seq-len {self.seq_len}",
                   self.steps * self.batch_size * self.seq_len, "--heal-steps")


@dataclass
class PruneOptions:
    """Which blocks go (exactly one of ``remove``, ``budget``, ``blocks``), chosen how, on what text."""

    # ---- what to remove
    tower: str = "language"  # an image-text wrapper's tower whose blocks go: language (chosen on text) or vision
    #                          (chosen on image-text items: the loss of their answers); the whole wrapper is written
    unit: str = "block"  # what goes: whole blocks, or the attention (attn) or MLP (mlp) sublayer of blocks
    method: str = "removal"  # how to choose blocks (ignored with blocks): removal | angular-block | influence
    remove: int | None = None  # remove N blocks
    budget: float | None = None  # or: the most blocks within this many nats of extra held-out loss
    blocks: list[int] | None = None  # or: exactly these blocks (1-based), e.g. 21,22,23
    # ---- data
    data: str = "builtin"  # text: its val split chooses and evaluates, its train split heals
    tokens: int = 2048  # held-out tokens
    seq_len: int = 256  # tokens per sequence
    batch_size: int = 8  # sequences per forward
    images: int = 64  # --tower vision: image-text items (--data: builtin-shapes, an MMMU-format file, an image folder)
    heal: HealOptions = field(default_factory=HealOptions)  # healing after the surgery
    latency_tokens: int = 16  # new tokens generated for the latency measurement
    generate: str | None = None  # generative task scored by exact match before and after: builtin-arith, builtin-verses, .jsonl
    generate_limit: int = 50  # its first N items
    progress: bool = True  # progress bars
    # ---- engine
    stream: bool | None = None  # read the model layer by layer (no latency; LoRA healing); default: when it exceeds free memory

    def validate(self, n_layers: int | None = None) -> None:
        """Refuse a bad request in one line naming the flag and the value: without ``n_layers`` what needs no
        model (run before it is loaded), with it also the ranges that depend on the model's blocks."""
        given = [name for name in ("remove", "budget", "blocks") if getattr(self, name) is not None]
        if len(given) != 1:
            raise DepthlabError("give exactly one of --remove N, --budget NATS, --blocks LIST"
                                + (f" (got {', '.join('--' + g for g in given)})" if given else ""))
        from depthlab.hf.wrappers import check_tower_name

        check_tower_name(self.tower)
        check_int("--images", self.images, 1, MAX_TOKENS)
        if self.unit not in UNIT_CHOICES:
            raise DepthlabError(f"unknown --unit {self.unit!r}; {choices(UNIT_CHOICES)}")
        if self.generate is not None:
            from depthlab.data.gentasks import GEN_TASKS

            if self.generate not in GEN_TASKS and not self.generate.endswith((".jsonl", ".json")):
                raise DepthlabError(f"unknown --generate task {self.generate!r}; choose one of: {', '.join(GEN_TASKS)} "
                                    "or a .jsonl file of prompt/answer rows")
        check_int("--generate-limit", self.generate_limit, 1)
        if self.method not in METHODS:
            raise DepthlabError(f"unknown --method {self.method!r}; {choices(METHODS)}")
        if self.remove is not None:
            check_int("--remove", self.remove, 1)
            if n_layers is not None and self.unit != "block" and self.remove > n_layers:  # every one may go
                raise DepthlabError(f"--remove {self.remove} is out of range: the model has {n_layers} {self.unit} "
                                    f"sublayers (--unit {self.unit}), so remove 1..{n_layers}")
            if n_layers is not None and self.unit == "block" and self.remove >= n_layers:
                raise DepthlabError(f"--remove {self.remove} is out of range: the model has {n_layers} blocks, so "
                                    + (f"remove 1..{n_layers - 1}" if n_layers > 1 else "none can be removed"))
        if self.budget is not None:
            check_number("--budget", self.budget, minimum=0)
        if self.blocks is not None:
            check_blocks(self.blocks, n_layers)
        check_int("--tokens", self.tokens, 1, MAX_TOKENS)
        check_int("--seq-len", self.seq_len, 2)
        check_int("--batch-size", self.batch_size, 1)
        check_int("--latency-tokens", self.latency_tokens, 1, MAX_TOKENS)
        self.heal.validate()


def check_blocks(blocks: list[int], n_layers: int | None) -> None:
    if not blocks:
        raise DepthlabError("--blocks names no block; give 1-based block numbers, e.g. --blocks 2,3")
    top = "" if n_layers is None else f" (the model has blocks 1..{n_layers})"
    for b in blocks:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1 or (n_layers is not None and b > n_layers):
            raise DepthlabError(f"--blocks {b} is out of range: block numbers start at 1{top}")
    if len(set(blocks)) != len(blocks):
        raise DepthlabError(f"--blocks names a block twice: {','.join(map(str, blocks))}")
    if n_layers is not None and len(blocks) >= n_layers:
        raise DepthlabError(f"--blocks {','.join(map(str, blocks))} would remove all {n_layers} blocks; keep at least one")
