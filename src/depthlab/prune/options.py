"""What ``prune`` removes, how it chooses and how it heals: plain data, no torch (the command line derives its
flags from it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from depthlab.base.errors import MAX_TOKENS, DepthlabError, check_int, check_number, check_work, choices

METHODS = ("removal", "angular-block", "influence")  # how blocks are chosen (depthlab.prune.select)
EXPERT_METHODS = ("reap", "frequency", "random")  # how routed experts are chosen (depthlab.prune.experts)
UNIT_CHOICES = ("block", "attn", "mlp", "expert")  # what one removal takes out: a block, one block's attention or MLP,
#                                                   or one routed expert of an MoE block
SHARED = "shared"  # what --experts calls a block's shared expert (refused: every token reads it)
HEAL_MODES = ("full", "lora", "linear")
LINEAR_FORMS = ("full", "diagonal", "lowrank")  # the map --heal linear fits per removed span (depthlab.prune.heal_linear)


@dataclass
class HealOptions:
    """Short continued training of a pruned model (all weights, or LoRA adapters merged back)."""

    data: str = "builtin"  # a depthlab data spec; its train split is used
    steps: int = 0  # continued-training steps after pruning (0: no healing; --heal linear takes none)
    mode: str = "full"  # train all weights, LoRA adapters (needs peft), or fit a map per removed span: full | lora | linear
    lr: float = 1e-4  # AdamW learning rate
    batch_size: int = 8  # sequences per healing step
    seq_len: int = 256  # tokens per healing sequence
    warmup: int = 10  # steps of linear warm-up
    lora_rank: int = 16  # rank of the LoRA adapters
    seed: int = 0  # data order and adapter init
    linear: str = "full"  # --heal linear's map per removed span: full (d x d) | diagonal | lowrank (identity + rank r)
    linear_rank: int = 64  # --heal linear lowrank: the rank r of its correction to the identity
    calib_tokens: int = 8192  # --heal linear: calibration tokens (the train split of --data) it is fitted on
    checkpoint: bool | None = None  # recompute activations in the backward (default: if they outweigh weights or 1/4 free memory)
    return_memory: bool = True  # give freed activations back to the system (glibc): ~2.5x less peak, ~1.5x step time
    progress: bool = True  # a progress bar

    @property
    def active(self) -> bool:
        """Whether the pruned model is healed: training steps asked for, or the linear map (which takes none)."""
        return self.steps > 0 or self.mode == "linear"

    def validate(self) -> None:
        """Refuse, in one line naming the flag and the value, what cannot work (before anything is loaded)."""
        if self.mode not in HEAL_MODES:
            raise DepthlabError(f"unknown --heal {self.mode!r}; {choices(HEAL_MODES)}")
        if self.mode == "linear":
            if self.steps:
                raise DepthlabError(f"--heal linear fits its maps by least squares, with no training steps; drop "
                                    f"--heal-steps {self.steps}")
            if self.linear not in LINEAR_FORMS:
                raise DepthlabError(f"unknown --heal-linear {self.linear!r}; {choices(LINEAR_FORMS)}")
            check_int("--heal-linear-rank", self.linear_rank, 1)
            check_int("--heal-calib-tokens", self.calib_tokens, 1, MAX_TOKENS)
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
    unit: str = "block"  # what goes: whole blocks, the attention (attn) or MLP (mlp) sublayer of blocks, or experts
    method: str | None = None  # how to choose: removal | angular-block | influence; experts: reap | frequency | random
    remove: int | None = None  # remove N blocks (--unit expert: N routed experts of every MoE block)
    budget: float | None = None  # or: the most blocks (experts per MoE block) within this many nats of extra held-out loss
    blocks: list[int] | None = None  # or: exactly these blocks (1-based), e.g. 21,22,23
    fraction: float | None = None  # or (--unit expert): this fraction of the routed experts of every MoE block, e.g. 0.25
    experts: list[str] | None = None  # or (--unit expert): exactly these, BLOCK:EXPERT (expert from 0), e.g. 2:0,2:5
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

    def __post_init__(self) -> None:
        if self.method is None:  # the default of the unit: greedy removal for blocks and sublayers, REAP for experts
            self.method = EXPERT_METHODS[0] if self.unit == "expert" else METHODS[0]

    def validate(self, n_layers: int | None = None) -> None:
        """Refuse a bad request in one line naming the flag and the value: without ``n_layers`` what needs no
        model (run before it is loaded), with it also the ranges that depend on the model's blocks."""
        if self.unit not in UNIT_CHOICES:
            raise DepthlabError(f"unknown --unit {self.unit!r}; {choices(UNIT_CHOICES)}")
        expert = self.unit == "expert"
        ways = ("remove", "budget", "fraction", "experts") if expert else ("remove", "budget", "blocks")
        given = [name for name in ("remove", "budget", "blocks", "fraction", "experts") if getattr(self, name) is not None]
        if len(given) != 1 or given[0] not in ways:
            wrong = [g for g in given if g not in ways]
            if wrong:
                raise DepthlabError(f"--{wrong[0]} " + ("chooses blocks; with --unit expert give" if expert else
                                                        "chooses routed experts (--unit expert); with --unit "
                                                        f"{self.unit} give") + " one of "
                                    + ", ".join("--" + w for w in ways))
            raise DepthlabError("give exactly one of " + ", ".join("--" + w for w in ways)
                                + (f" (got {', '.join('--' + g for g in given)})" if given else ""))
        if expert:
            self._validate_experts()
        from depthlab.hf.wrappers import check_tower_name

        check_tower_name(self.tower)
        check_int("--images", self.images, 1, MAX_TOKENS)
        if self.generate is not None:
            from depthlab.data.gentasks import GEN_TASKS

            if self.generate not in GEN_TASKS and not self.generate.endswith((".jsonl", ".json")):
                raise DepthlabError(f"unknown --generate task {self.generate!r}; choose one of: {', '.join(GEN_TASKS)} "
                                    "or a .jsonl file of prompt/answer rows")
        check_int("--generate-limit", self.generate_limit, 1)
        methods = EXPERT_METHODS if expert else METHODS
        if self.method not in methods:
            other = " (a method for blocks and sublayers)" if self.method in METHODS else \
                " (a method for --unit expert)" if self.method in EXPERT_METHODS else ""
            raise DepthlabError(f"unknown --method {self.method!r} for --unit {self.unit}{other}; {choices(methods)}")
        if self.remove is not None and expert:
            check_int("--remove", self.remove, 1)
        elif self.remove is not None:
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


    def _validate_experts(self) -> None:
        """--fraction in (0, 1); --experts as BLOCK:EXPERT entries naming no shared expert."""
        if self.fraction is not None:
            check_number("--fraction", self.fraction, above=0, maximum=1)
            if self.fraction >= 1:
                raise DepthlabError(f"--fraction {self.fraction:g} would remove every routed expert; give a fraction "
                                    "below 1 (each token needs its top-k experts)")
        if self.experts is not None:
            parse_experts(self.experts)


def parse_experts(entries: list[str]) -> dict[int, list[int]]:
    """``--experts`` entries ``BLOCK:EXPERT`` -> {1-based block: [0-based experts]}; one line for a malformed entry or
    a shared expert (every token reads it: never removed)."""
    if not entries:
        raise DepthlabError("--experts names no expert; give BLOCK:EXPERT entries, e.g. --experts 2:0,2:5")
    out: dict[int, list[int]] = {}
    for entry in entries:
        block, _, expert = str(entry).partition(":")
        if expert.strip().lower() == SHARED:
            raise DepthlabError(f"--experts {entry}: a shared expert is never removed (every token reads it); name "
                                "routed experts, BLOCK:EXPERT with EXPERT from 0")
        try:
            b, e = int(block), int(expert)
        except ValueError:
            b, e = 0, -1
        if b < 1 or e < 0:
            raise DepthlabError(f"--experts {entry!r} is not BLOCK:EXPERT (block from 1, expert from 0), e.g. 2:5")
        out.setdefault(b, []).append(e)
    return out


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
