"""What ``diagnose`` measures and on what: plain data, no torch (the command line derives its flags from it)."""

from __future__ import annotations

from dataclasses import dataclass

from depthlab.base.errors import MAX_TOKENS, DepthlabError, check_int, check_number, choices

SPLITS = ("auto", "val", "all", "train")


@dataclass
class DiagnoseOptions:
    """Options of :func:`depthlab.analysis.diagnostics.diagnose`. ``depthlab diagnose`` sizes ``tokens`` and ``jacobian``
    to the device when they are not given (see ``depthlab.cli.diagnose``)."""

    # ---- what is measured
    tower: str = "language"  # an image-text wrapper's tower: language (on text) or vision (on image-text items)
    # ---- data
    data: str = "builtin"  # evaluation text: builtin, a .txt/.jsonl/.parquet, dir, glob, hf:NAME; --tower vision:
    #                        builtin (builtin-shapes), an image-text task file or glob (MMMU's format), an image folder
    images: int = 64  # --tower vision: image-text items (each item's answer is scored given its image and question)
    split: str = "auto"  # split of data; auto: val for builtin data and depthlab runs, else all
    tokens: int = 16384  # evaluation tokens, rounded up to whole sequences (diagnose: sized to the device)
    seq_len: int = 256  # tokens per sequence (diagnose: 256, or the model's context when shorter)
    batch_size: int = 8  # sequences per forward
    # ---- what to measure
    removal: bool = True  # the layer-removal sweep (causal LMs only)
    swap: bool = True  # the swap test: Δloss with adjacent blocks l, l+1 exchanged, every pair (causal LMs; ~ removal's cost)
    sublayers: bool = True  # attention and MLP separately: contribution, angular distance, removal Δloss (causal LMs)
    lens: bool = True  # the logit lens: each layer's stream decoded by the final norm and head (causal LMs)
    tuned_lens: bool = False  # a tuned lens too: an affine map per layer fitted on half the batches, measured on the rest
    jacobian: bool = True  # block Jacobians (diagnose: on a GPU, or on a CPU for widths up to 256)
    jac_samples: int = 4  # sampled tokens per block
    jac_context: int = 32  # sampled positions lie in [0, jac_context): the cost grows with it
    jac_layers: list[int] | None = None  # blocks (1-based) to differentiate; None = all
    heatmap_layers: list[int] | None = None  # blocks whose mean Jacobian is drawn; None = 4 spread out
    heatmap_dims: int = 64  # top-left corner of the D x D matrix shown
    mc: str | None = None  # multiple-choice task for the accuracy drop, as `evaluate` takes it (.jsonl, builtin-mc)
    mc_limit: int | None = None  # first N items only
    # ---- summary
    loss_budget: float = 0.1  # nats of held-out loss one may lose by removing blocks
    identity_threshold: float = 0.1  # adjacent angular distance below which a block counts as near-identity
    effective_threshold: float = 0.01  # effective depth: blocks whose removal costs more than this x the model's loss
    joint_check: bool = True  # verify the removable set by removing it jointly (a few extra passes)
    seed: int = 0  # seeds the sampled Jacobian positions
    progress: bool = True  # progress bars on a terminal, ETA log lines otherwise
    # ---- engine
    stream: bool | None = None  # read the model layer by layer; default: when it exceeds free memory (HF safetensors dirs, runs)

    def validate(self, prefix: str = "--") -> None:
        """Refuse, in one line naming the flag (``prefix`` + field, e.g. ``--diag-tokens`` in compare) and the
        value, what cannot work: before a model is loaded."""
        def flag(name: str) -> str:
            return prefix + name.replace("_", "-")

        from depthlab.hf.wrappers import check_tower_name

        check_tower_name(self.tower)
        check_int(flag("images"), self.images, 1, MAX_TOKENS)
        if self.split not in SPLITS:
            raise DepthlabError(f"unknown {flag('split')} {self.split!r}; {choices(SPLITS)}")
        for name, low in (("tokens", 1), ("seq_len", 2), ("batch_size", 1), ("jac_samples", 1), ("jac_context", 1),
                          ("heatmap_dims", 1)):
            check_int(flag(name), getattr(self, name), low, MAX_TOKENS)
        if self.mc_limit is not None:
            check_int(flag("mc_limit"), self.mc_limit, 1)
        check_int(flag("seed"), self.seed, 0, 2**32 - 1)
        if self.tuned_lens and not self.lens:
            raise DepthlabError(f"{flag('tuned_lens')} is compared with the logit lens; drop {flag('no_lens')} or "
                                f"{flag('tuned_lens')}")
        check_number(flag("loss_budget"), self.loss_budget, minimum=0)
        check_number(flag("identity_threshold"), self.identity_threshold, minimum=0, maximum=1)
        check_number(flag("effective_threshold"), self.effective_threshold, minimum=0, maximum=1)
        for name in ("jac_layers", "heatmap_layers"):
            blocks = getattr(self, name)
            if blocks is not None and (not blocks or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                         for b in blocks)):
                raise DepthlabError(f"{flag(name)} {','.join(map(str, blocks)) or repr('')} is out of range: give "
                                    "1-based block numbers, e.g. 1,2")
            if blocks is not None and len(set(blocks)) != len(blocks):
                raise DepthlabError(f"{flag(name)} {','.join(map(str, blocks))} names a block twice; give each once")

    def check_blocks(self, n_layers: int | None, prefix: str = "--") -> None:
        """The block numbers of ``jac_layers`` / ``heatmap_layers`` against the model's ``n_layers`` blocks: run once
        the model is loaded, before any pass over data."""
        for name in ("jac_layers", "heatmap_layers"):
            blocks = getattr(self, name) or []
            bad = [b for b in blocks if n_layers is not None and b > n_layers]
            if bad:
                raise DepthlabError(f"{prefix}{name.replace('_', '-')} {','.join(map(str, blocks))} is out of range: "
                                    f"the model has blocks 1..{n_layers}")
