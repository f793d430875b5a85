"""The scheme registry: the ONE place where a scheme name means something.

A ``Scheme`` entry is self-contained: its block factory, its init rule (a callable), its own options
with their validation, its final norm and its post-init pass (Admin's profiling). Nothing else in
depthlab dispatches on a scheme name; the CLI help, the export refusal list and the README's scheme
table are generated from here. Equations and sources: docs/paper.md §1 (LNS), §2 (the paper's schemes), §9 (2025 schemes).

Adding a scheme is one entry below (plus, if it needs one, its own module under ``depthlab.models.nn``)::

    Scheme("my-ln", "x + f(N(x)) with ...", "Author et al. 2025", _my_block, options=(choice(...),))
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from depthlab.base.errors import ConfigError, choices
from depthlab.models import nn as N  # a lazy package: its modules (and torch) load when the first block is built
from depthlab.models.nn.init import InitRule, deepnorm_beta, init_deepnorm, init_depth_scaled, init_normal, init_scaled

if TYPE_CHECKING:  # types only: the config module knows nothing of schemes; torch loads when a model is built
    from torch import nn

    from depthlab.models.config import ModelConfig

__all__ = [
    "Scheme", "Option", "SCHEMES", "BASELINE_SCHEME", "get_scheme", "lns_scale", "deepnorm_alpha", "deepnorm_beta",
    "layerscale_eps", "LNS_SLOTS", "LNS_POSITIONS", "scheme_table", "scheme_names", "Parts", "decoder_parts", "SchemeSpec",
    "parse_scheme_spec", "OptimRules", "completep_multiplier", "attnres_slots",
]

BASELINE_SCHEME = "pre"  # the scheme every comparison is measured against


# ============================================================================ options
@dataclass(frozen=True)
class Option:
    """A scheme's own setting: a name, a default, a parser that validates (raises ``ConfigError``).

    ``alias`` is the flat keyword that also reaches it (``lns_position=`` for LNS's ``position``),
    so ``from_preset(..., scheme="lns", lns_position="after-branch")`` keeps working."""

    name: str
    default: Any
    parse: Callable[[str, Any], Any]  # (qualified name, raw value) -> value, or raise ConfigError
    help: str
    alias: str | None = None
    values: tuple[str, ...] = ()  # the choices, for a choice option (docs and help)

    def describe(self) -> str:
        shown = ", ".join(f"**{v}**" if v == self.default else v for v in self.values) if self.values else \
            f"default {self.default!r}"
        return f"`{self.name}`: {self.help} ({shown})"


def choice(name: str, values: tuple[str, ...], default: str, help: str, alias: str | None = None) -> Option:
    def parse(where: str, value: Any) -> str:
        if value not in values:
            raise ConfigError(f"unknown {where} {value!r}; {choices(values)}")
        return value

    return Option(name, default, parse, help, alias, values)


def number(name: str, default: float | int | None, help: str, *, lo: float, hi: float = math.inf,
           integer: bool = False, alias: str | None = None) -> Option:
    def parse(where: str, value: Any) -> float | int | None:
        if value is None and default is None:
            return None
        try:
            num = (int if integer else float)(value)
        except (TypeError, ValueError):
            num = None
        if num is None or isinstance(value, bool) or (integer and num != float(value)) or not lo <= num <= hi:
            kind = "an integer" if integer else "a number"
            raise ConfigError(f"{where} must be {kind} in [{lo:g}, {hi:g}], got {value!r}")
        return num

    return Option(name, default, parse, help, alias)


# ============================================================================ the scheme
BlockFactory = Callable[["Parts", dict[str, Any], int], "nn.Module"]  # (parts, options, l) -> block


def _unit_lr(name: str) -> float:
    return 1.0


@dataclass(frozen=True)
class OptimRules:
    """What a scheme asks of the optimiser (trainer-side rules, applied by ``depthlab.train.optim``):
    a learning-rate multiplier per parameter, by its name in the model (``blocks.3.attn.q_proj.weight``),
    on top of the schedule, and a multiplier on Adam's epsilon. Most schemes ask nothing (all 1)."""

    lr_scale: Callable[[str], float] = _unit_lr  # parameter name -> multiplier of the scheduled lr
    eps_scale: float = 1.0  # multiplier of TrainConfig.adam_eps



@dataclass(frozen=True)
class Scheme:
    name: str
    summary: str  # one line: the block's equation in words
    source: str  # where it comes from (paper, model)
    build_block: BlockFactory  # (parts, resolved options, l) -> block; l is the 1-based depth
    init: InitRule = init_normal  # (model) -> None, run under no_grad on a fresh model
    options: tuple[Option, ...] = ()
    build_final_norm: Callable[["Parts", dict[str, Any]], "nn.Module"] | None = None  # None: the family's norm
    build_embed_norm: Callable[["Parts", dict[str, Any]], "nn.Module"] | None = None  # None: no norm
    post_init: Callable[["nn.Module"], None] | None = None  # e.g. Admin's profiling pass, after ``init``
    check: Callable[["ModelConfig", dict[str, Any]], str | None] | None = None  # options vs shapes: error or None
    optim_rules: Callable[["ModelConfig", dict[str, Any]], OptimRules] | None = None  # None: OptimRules()
    extras: dict[str, Any] = field(default_factory=dict)  # free-form facts for docs (e.g. {"lns": True})

    # ------------------------------------------------------------------ options
    def option(self, name: str) -> Option:
        for opt in self.options:
            if name in (opt.name, opt.alias):
                return opt
        names = [o.name for o in self.options]
        raise ConfigError(f"scheme {self.name!r} has no option {name!r}; "
                          + (choices(names) if names else "it takes no options"))

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Every option of this scheme, validated: ``given`` (by name or alias) over the defaults."""
        out = {o.name: o.default for o in self.options}
        for key, value in given.items():
            opt = self.option(key)
            out[opt.name] = opt.parse(f"{self.name} option {opt.name!r}" if key == opt.name else key, value)
        return out

    def canonical(self, given: dict[str, Any]) -> dict[str, Any]:
        """The options that differ from their defaults, under their own names (what a config stores)."""
        resolved = self.resolve(given)
        return {o.name: resolved[o.name] for o in self.options if resolved[o.name] != o.default}

    def validate(self, cfg: "ModelConfig") -> dict[str, Any]:
        """Check ``cfg``'s options for this scheme (and against its shapes); return them resolved."""
        opts = self.resolve(cfg.scheme_options)
        problem = self.check(cfg, opts) if self.check is not None else None
        if problem:
            raise ConfigError(problem)
        return opts

    # ------------------------------------------------------------------ building
    def block(self, parts: "Parts", options: dict[str, Any], layer: int) -> "nn.Module":
        """Block ``layer`` (1-based depth) made of ``parts``, with resolved ``options``."""
        return self.build_block(parts, options, layer)

    def final_norm(self, parts: "Parts", options: dict[str, Any]) -> "nn.Module":
        """The norm before the head: the family's norm (never scaled by LNS) unless the scheme says."""
        return parts.norm() if self.build_final_norm is None else self.build_final_norm(parts, options)

    def embed_norm(self, parts: "Parts", options: dict[str, Any]) -> "nn.Module":
        """What the embedding output passes through before block 1 (``nn.Identity``: nothing)."""
        return N.Identity() if self.build_embed_norm is None else self.build_embed_norm(parts, options)

    def optimizer_rules(self, cfg: "ModelConfig") -> OptimRules:
        """The learning-rate / epsilon rules the trainer applies to a model of ``cfg`` (validated)."""
        return OptimRules() if self.optim_rules is None else self.optim_rules(cfg, self.validate(cfg))

    def describe(self) -> str:
        """One paragraph for help texts: the summary, the source and the options."""
        opts = "; ".join(o.describe() for o in self.options)
        return f"{self.summary} ({self.source})" + (f". Options: {opts}" if opts else "")


# ============================================================================ shared pieces
def lns_scale(layer: int) -> float:
    """LayerNorm Scaling factor of block ``layer`` (1-based): 1/sqrt(l). docs/paper.md §1.2."""
    return 1.0 / math.sqrt(layer)


def deepnorm_alpha(n_layers: int) -> float:
    """DeepNet residual weight for decoder-only models: (2L)^(1/4)."""
    return (2.0 * n_layers) ** 0.25


def layerscale_eps(n_layers: int, init: float | None) -> float:
    """CaiT's rule: 0.1 up to 18 layers, 1e-5 up to 24, 1e-6 deeper (unless set explicitly)."""
    if init is not None:
        return init
    return 0.1 if n_layers <= 18 else 1e-5 if n_layers <= 24 else 1e-6


@dataclass(frozen=True)
class Parts:
    """What blocks are made of, per model family: a scheme decides where norms, scales and gains go,
    the family what a norm, an attention and a feed-forward are. The LLaMA decoder's parts are RMSNorm,
    causal RoPE attention and SwiGLU (``decoder_parts``); a ViT's are LayerNorm, bidirectional
    attention and a GELU MLP. So every scheme applies to every family, from one registry."""

    d_model: int
    n_layers: int
    attention: Callable[[], "nn.Module"]  # a fresh attention branch, called as attn(x, rope)
    ffn: Callable[[], "nn.Module"]  # a fresh feed-forward branch
    norm: Callable[..., "nn.Module"]  # norm(scale=1.0, dim=None): a fresh norm (over dim, default d_model), output x scale
    group_norm: Callable[[int], "nn.Module"]  # group_norm(groups): normalises channel groups separately


def decoder_parts(cfg: "ModelConfig") -> Parts:
    """The LLaMA decoder's parts: RMSNorm, causal RoPE attention (QK-norm optional), SwiGLU."""
    def attention() -> "nn.Module":
        qk = (lambda: N.RMSNorm(cfg.dim_head, cfg.norm_eps)) if cfg.qk_norm else (lambda: None)
        return N.Attention(cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.dim_head, cfg.qkv_bias, qk(), qk())

    return Parts(cfg.d_model, cfg.n_layers, attention, lambda: N.SwiGLU(cfg.d_model, cfg.d_ff),
                 lambda scale=1.0, dim=None: N.RMSNorm(dim or cfg.d_model, cfg.norm_eps, scale=scale),
                 lambda groups: N.GroupRMSNorm(cfg.d_model, groups, cfg.norm_eps))


def _pre_block(p: Parts, layer: int, norm: Callable[[], "nn.Module"] | None = None, **slots) -> "nn.Module":
    return N.PreNormBlock(layer, p.attention(), p.ffn(), norm or p.norm, **slots)


def _post_block(p: Parts, layer: int, **slots) -> "nn.Module":
    return N.PostNormBlock(layer, p.attention(), p.ffn(), p.norm, **slots)


# ============================================================================ the schemes
def _pre(p, opts, layer):
    return _pre_block(p, layer)


#: LNS insertion positions (paper Table 8, docs/paper.md §1.4) -> the PreNormBlock slots that carry
#: 1/sqrt(l): a ``*_norm`` slot gets ``RMSNorm(scale=1/sqrt(l))``, any other slot ``N.Scale(1/sqrt(l))``.
LNS_SLOTS: dict[str, tuple[str, ...]] = {
    "after-norm": ("attn_norm", "ffn_norm"),  # the method
    "before-norm": ("attn_prescale", "ffn_prescale"),
    "after-branch": ("attn_out", "ffn_out"),
    "after-residual": ("resid_scale",),  # diverges in the paper
    "attn-only": ("attn_norm",),
    "ffn-only": ("ffn_norm",),
}
LNS_POSITIONS = tuple(LNS_SLOTS)
LNS_POSITION = choice("position", tuple(LNS_SLOTS), "after-norm", "where 1/sqrt(l) multiplies (paper Table 8)",
                      alias="lns_position")


def _lns(p, opts, layer):
    s = lns_scale(layer)
    slots = {slot: p.norm(scale=s) if slot.endswith("_norm") else N.Scale(s) for slot in LNS_SLOTS[opts["position"]]}
    return _pre_block(p, layer, **slots)


def _post(p, opts, layer):
    return _post_block(p, layer)


def _mix(p, opts, layer):
    n_post = int(math.floor(opts["alpha"] * p.n_layers + 0.5))  # round(alpha*L): 3 of 12, 6 of 24
    return _post_block(p, layer) if layer <= n_post else _pre_block(p, layer)


def _deepnorm(p, opts, layer):
    a = deepnorm_alpha(p.n_layers)
    return _post_block(p, layer, attn_resid=N.Scale(a), ffn_resid=N.Scale(a))


def _sandwich(p, opts, layer):
    return _pre_block(p, layer, attn_out=p.norm(), ffn_out=p.norm())


def _admin(p, opts, layer):
    # omega starts at 1 and is set by admin_profile() from a forward pass at init.
    return _post_block(p, layer, attn_resid=N.ChannelGain(p.d_model, 1.0), ffn_resid=N.ChannelGain(p.d_model, 1.0))


def _group_ln(p, opts, layer):
    return _pre_block(p, layer, norm=lambda: p.group_norm(opts["groups"]))


def _skipinit(p, opts, layer):
    g = 1.0 / math.sqrt(p.n_layers)
    return _pre_block(p, layer, attn_out=N.ScalarGain(g), ffn_out=N.ScalarGain(g))


def _layerscale(p, opts, layer):
    eps = layerscale_eps(p.n_layers, opts["init"])
    return _pre_block(p, layer, attn_out=N.ChannelGain(p.d_model, eps), ffn_out=N.ChannelGain(p.d_model, eps))


def _peri_ln(p, opts, layer):
    return _pre_block(p, layer, attn_out=p.norm(), ffn_out=p.norm())


def _dyt(p, opts, layer):
    return _pre_block(p, layer, norm=lambda: N.DyT(p.d_model, opts["alpha_init"]))


def _dyt_final(p, opts):
    return N.DyT(p.d_model, opts["alpha_init"])


# ------------------------------------------------------------- OLMo-core's depth schemes (docs/paper.md §9.4-9.8)
def _lns_uniform(p, opts, layer):
    s = 1.0 / math.sqrt(p.n_layers)  # the same factor in every block
    return _pre_block(p, layer, attn_norm=p.norm(scale=s), ffn_norm=p.norm(scale=s))


def completep_multiplier(n_layers: int, base_depth: int, alpha: float) -> float:
    """Depth-muP / CompleteP residual-branch multiplier (L / L_base)^(-alpha)."""
    return (n_layers / base_depth) ** -alpha


def _completep(p, opts, layer):
    m = completep_multiplier(p.n_layers, opts["base_depth"], opts["alpha"])
    return _pre_block(p, layer, attn_out=N.Scale(m), ffn_out=N.Scale(m))


def _completep_rules(cfg, opts) -> OptimRules:
    """CompleteP's depth rules for Adam (Dey et al. 2025, Table 1, at width multiplier 1): with
    m = L / L_base, every parameter inside the blocks learns at lr * m^(alpha-1) (the embedding, the
    final norm and the head at lr), and Adam's epsilon is eps * m^(-alpha)."""
    m = cfg.n_layers / opts["base_depth"]
    block_lr = m ** (opts["alpha"] - 1.0)
    return OptimRules(lr_scale=lambda name: block_lr if name.startswith("blocks.") else 1.0,
                      eps_scale=m ** -opts["alpha"])


def _keel(p, opts, layer):
    # block 1: Pre-LN attention (no alpha, no output norm), Post-LN FFN without alpha (OLMo-core main)
    if layer == 1:
        return _post_block(p, layer, attn_in=p.norm(), attn_norm=N.Identity(), ffn_in=p.norm())
    a = 2.0 * p.n_layers  # KEEL counts attention and FFN as separate sub-layers
    return _post_block(p, layer, attn_in=p.norm(), ffn_in=p.norm(), attn_resid=N.Scale(a), ffn_resid=N.Scale(a))


def _reordered(p, opts, layer):
    return _pre_block(p, layer, attn_norm=N.Identity(), ffn_norm=N.Identity(), attn_out=p.norm(), ffn_out=p.norm())


#: (mode, constraint) -> the hyper-connection around one sub-layer: fn(parts, streams, index, sinkhorn_iters)
_HYPER: dict[tuple[str, str], Callable[..., "nn.Module"]] = {
    ("static", "none"): lambda p, n, k, it: N.HyperConnection(p.d_model, n, k),
    ("dynamic", "none"): lambda p, n, k, it: N.DynamicHyperConnection(p.d_model, n, k, p.norm()),
    ("static", "sinkhorn"): lambda p, n, k, it: N.ManifoldHyperConnection(p.d_model, n, k, it),
    ("dynamic", "sinkhorn"): lambda p, n, k, it: N.DynamicManifoldHyperConnection(p.d_model, n, k, it),
}


def _mhc(p, opts, layer):
    def connection(index: int) -> "nn.Module":  # index: 0-based over all 2L sub-layers
        return _HYPER[opts["mode"], opts["constraint"]](p, opts["streams"], index, opts["sinkhorn_iters"])

    return N.HyperBlock(layer, p.attention(), p.ffn(), p.norm(), p.norm(), connection(2 * layer - 2),
                      connection(2 * layer - 1))


_MHC_OPTIONS = (
    number("streams", 4, "residual streams n", lo=2, hi=16, integer=True),
    choice("mode", ("dynamic", "static"), "dynamic", "connection weights computed per token, or fixed"),
    choice("constraint", ("sinkhorn", "none"), "sinkhorn",
           "sinkhorn: mHC (sigmoid pre/post, doubly stochastic res); none: HC's free weights"),
    number("sinkhorn_iters", 20, "Sinkhorn-Knopp iterations of the mHC projection", lo=1, hi=100, integer=True),
)


# ------------------------------------------------------------- the 2026 depth schemes (docs/paper.md §9.9-9.12)
def attnres_slots(n_layers: int, blocks: int) -> tuple[list[str], list[tuple[tuple[int, int], tuple[int, int]]]]:
    """Attention Residuals' depth sources over ``n_layers`` layers: (the label of each source slot, and per
    layer ``((attn_read, attn_write), (ffn_read, ffn_write))``: a sub-layer reads slots ``0 .. read-1`` and
    adds its output into slot ``write``). Slot 0 is the embedding.

    ``blocks = 0``: Full AttnRes, one slot per sub-layer output, each sub-layer reading every earlier one.
    ``blocks = N``: Block AttnRes, the layers grouped into blocks of ceil(L/N) layers (the last one takes the
    rest); slot n is block n's sum, to which its sub-layers add; the first sub-layer of block n reads the
    completed blocks 0 .. n-1, the others also block n's partial sum (paper eq. 6; the official pseudo-code
    starts a block at every ``block_size / 2``-th layer)."""
    if blocks == 0:
        labels = ["embedding"] + [f"{kind} {l}" for l in range(1, n_layers + 1) for kind in ("attn", "ffn")]
        return labels, [((2 * l - 1, 2 * l - 1), (2 * l, 2 * l)) for l in range(1, n_layers + 1)]
    size = -(-n_layers // blocks)  # layers per block
    starts = list(range(1, n_layers + 1, size))
    labels = ["embedding"] + [f"layers {a}-{min(a + size - 1, n_layers)}" if size > 1 else f"layer {a}" for a in starts]
    layout = []
    for l in range(1, n_layers + 1):
        n, first = (l - 1) // size + 1, (l - 1) % size == 0
        layout.append(((n if first else n + 1, n), (n + 1, n)))
    return labels, layout


def _attnres_depth(p: Parts, reader: str, labels: list[str], read: int) -> "nn.Module":
    return N.DepthAttention(p.d_model, reader, tuple(labels[:read]))


def _attnres(p, opts, layer):
    labels, layout = attnres_slots(p.n_layers, opts["blocks"])
    attn_slots, ffn_slots = layout[layer - 1]
    return N.AttnResBlock(layer, p.attention(), p.ffn(), p.norm(), p.norm(),
                          _attnres_depth(p, f"attn {layer}", labels, attn_slots[0]),
                          _attnres_depth(p, f"ffn {layer}", labels, ffn_slots[0]), len(labels), attn_slots, ffn_slots)


def _attnres_final(p, opts):
    labels, _ = attnres_slots(p.n_layers, opts["blocks"])
    return N.SourceCollapse(len(labels), _attnres_depth(p, "final", labels, len(labels)), p.norm())


def _attnres_embed(p, opts):
    return N.SourceExpand(len(attnres_slots(p.n_layers, opts["blocks"])[0]))


def _gpas(p, opts, layer):
    return _pre_block(p, layer, resid_scale=N.GradientPreservingScale())  # one gate, after both residual adds


def _siamese(p, opts, layer):
    return N.SiameseBlock(layer, p.attention(), p.ffn(), **{slot: p.norm() for slot in N.SiameseBlock.SLOTS})


def _qkv_normed(p: Parts) -> "nn.Module":
    """An attention whose queries, keys and values are each normalised per head (HybridNorm's QKV-norm)."""
    attn = p.attention()
    attn.q_norm, attn.k_norm, attn.v_norm = (p.norm(dim=attn.head_dim) for _ in range(3))
    return attn


def _hybridnorm(p, opts, layer):
    if layer == 1 and opts["first_block"] == "pre":  # HybridNorm*: block 1 Pre-Norm in both sub-layers
        return N.PreNormBlock(layer, _qkv_normed(p), p.ffn(), p.norm)
    return N.HybridNormBlock(layer, _qkv_normed(p), p.ffn(), p.norm())


def _own_qk_norm(cfg, opts) -> str | None:
    if getattr(cfg, "qk_norm", False):  # a ViT config has no qk_norm field
        return ("hybridnorm normalises queries, keys and values itself; qk_norm=True would add nothing "
                "(leave qk_norm off)")
    return None


def _attnres_check(cfg, opts) -> str | None:
    """Unpruned, and at most one block per layer (``blocks=99`` on 4 layers silently made 4 blocks)."""
    if cfg.block_depths is not None:
        return (f"attnres cannot run a pruned model (block_depths={cfg.block_depths}): its layers read depth "
                "sources fixed by their position in the full model")
    if opts["blocks"] > cfg.n_layers:
        return (f"attnres blocks={opts['blocks']} exceeds the model's {cfg.n_layers} layers; give 0 (Full AttnRes) "
                f"or 1..{cfg.n_layers}")
    return None


def admin_profile(model: "nn.Module") -> None:
    """Admin (Liu et al. 2020): set omega_i^2 = sum_{j<i} Var f_j from one profiling forward pass.

    Branches are numbered in execution order (attn_1, ffn_1, attn_2, ...); f_0 is the unit-variance
    normalised stream, so omega_1 = 1. Runs at init on random inputs the model draws itself
    (``model.profile_input(batch, generator)``: token ids for a decoder, pixels for a ViT); the omegas
    stay learnable.
    """
    import torch

    variances: list[float] = []
    branches = [m for block in model.blocks for m in (block.attn, block.ffn)]
    hooks = [b.register_forward_hook(lambda _m, _i, out: variances.append(out.float().var().item())) for b in branches]
    try:
        gen = torch.Generator().manual_seed(0)
        inputs = model.profile_input(4, gen)
        with torch.no_grad():
            model(inputs.to(next(model.parameters()).device))
    finally:
        for h in hooks:
            h.remove()
    gains = [g for block in model.blocks for g in (block.attn_resid, block.ffn_resid)]
    running = 1.0
    for gain, var in zip(gains, variances):
        gain.init = math.sqrt(running)
        gain.reset_parameters()
        running += var


_GROUPS = number("groups", 4, "channel groups normalised separately; must divide d_model", lo=1, integer=True,
                 alias="norm_groups")
_LNS = {"lns": True}

SCHEMES: dict[str, Scheme] = {s.name: s for s in [
    Scheme("pre", "Pre-LN: x + f(N(x)); every modern LLM", "Xiong et al. 2020", _pre),
    Scheme("post", "Post-LN: N(x + f(x)); the original Transformer", "Vaswani et al. 2017", _post),
    Scheme("lns", "LayerNorm Scaling: x + f(N(x) / sqrt(l)); the paper's method", "Sun et al. 2025", _lns,
           options=(LNS_POSITION,), extras=_LNS),
    Scheme("mix", "Mix-LN: the first round(alpha*L) blocks Post-LN, the rest Pre-LN", "Li et al. 2024", _mix,
           options=(number("alpha", 0.25, "fraction of leading Post-LN blocks", lo=0, hi=1, alias="mix_alpha"),)),
    Scheme("deepnorm", "DeepNorm: N(alpha*x + f(x)), alpha=(2L)^1/4, init gain (8L)^-1/4", "Wang et al. 2022 (DeepNet)",
           _deepnorm, init=init_deepnorm),
    Scheme("sandwich", "Sandwich-LN: x + N_b(f(N_a(x)))", "Ding et al. 2021 (CogView)", _sandwich),
    Scheme("admin", "Admin: N(omega*x + f(x)), omega profiled at init", "Liu et al. 2020", _admin,
           post_init=admin_profile),
    Scheme("group-ln", "Group-LN: Pre-LN whose RMSNorm normalises channel groups separately", "Wu & He 2018",
           _group_ln, options=(_GROUPS,),
           check=lambda cfg, o: f"d_model={cfg.d_model} is not divisible by norm_groups={o['groups']}"
           if cfg.d_model % o["groups"] else None),
    Scheme("scaled-init", "Scaled Init: Pre-LN, output projections std/sqrt(2L)", "GPT-2 / Megatron", _pre,
           init=init_scaled),
    Scheme("depth-scaled-init", "Depth-Scaled Init: Pre-LN, output projections std/sqrt(2l)", "Zhang et al. 2019",
           _pre, init=init_depth_scaled),
    Scheme("skipinit", "SkipInit: Pre-LN, a learnable scalar on each branch, init 1/sqrt(L)", "De & Smith 2020",
           _skipinit),
    Scheme("layerscale", "LayerScale: Pre-LN, a learnable diag(lambda) on each branch", "Touvron et al. 2021 (CaiT)",
           _layerscale, options=(number("init", None, "initial lambda; default by depth (CaiT)", lo=0,
                                        alias="layerscale_init"),)),
    Scheme("lns-scaled-init", "LNS + Scaled Init (worse than LNS alone in the paper)", "Sun et al. 2025", _lns,
           init=init_scaled, options=(LNS_POSITION,), extras=_LNS),
    Scheme("peri-ln", "Peri-LN: x + N_out(f(N_in(x))) in each branch, and a norm on the embedding output",
           "Kim et al. 2025; the Gemma 2/3 placement", _peri_ln, build_embed_norm=lambda p, o: p.norm()),
    Scheme("dyt", "DyT: Pre-LN with every norm replaced by gamma*tanh(alpha*x) + beta", "Zhu et al. 2025", _dyt,
           options=(number("alpha_init", 0.5, "initial alpha of every DyT", lo=0),),
           build_final_norm=_dyt_final),
    Scheme("lns-uniform", "Uniform LNS: x + f(N(x) / sqrt(L)), one factor for every block",
           "OLMo-core (LayerNormDepthScaledTransformerBlock)", _lns_uniform),
    Scheme("completep", "Depth-muP / CompleteP: x + (L/L_base)^-alpha * f(N(x)); in-block lr x (L/L_base)^(alpha-1), "
           "Adam eps x (L/L_base)^-alpha", "Dey et al. 2025 (CompleteP); Yang et al. 2023, Bordelon et al. 2023",
           _completep, options=(number("base_depth", 2, "L_base, the depth the base learning rate was tuned at",
                                       lo=1, integer=True),
                                number("alpha", 1.0, "depth exponent: 1 CompleteP, 0.5 Depth-muP, 0 plain Pre-LN",
                                       lo=0, hi=1)),
           optim_rules=_completep_rules),
    Scheme("keel", "KEEL: N(alpha*x + f(N(x))), alpha = 2L; block 1 Pre-LN attention, Post-LN FFN",
           "Chen & Wei 2026; OLMo-core (KeelTransformerBlock)", _keel),
    Scheme("reordered", "Reordered norm: x + N(f(x)), the norm on the branch output only", "OLMo 2 (OLMo et al. 2024)",
           _reordered),
    Scheme("mhc", "Hyper-Connections: n residual streams mixed around each branch; mHC keeps the mix doubly "
           "stochastic", "Zhu et al. 2024 (HC); Xie et al. 2025 (mHC)", _mhc, options=_MHC_OPTIONS,
           build_embed_norm=lambda p, o: N.StreamExpand(o["streams"]),
           build_final_norm=lambda p, o: N.StreamCollapse(o["streams"], p.norm())),
    Scheme("attnres", "Attention Residuals: each sub-layer reads a softmax(w_l . RMSNorm(v_i))-weighted sum of the "
           "earlier outputs v_i (embedding, sub-layer or block outputs), w_l zero at init", "Kimi Team 2026 "
           "(arXiv:2603.15031)", _attnres, build_embed_norm=_attnres_embed, build_final_norm=_attnres_final,
           options=(number("blocks", 0, "0: Full AttnRes (every sub-layer output a source); N: Block AttnRes, the "
                           "layers in N blocks whose sums are the sources", lo=0, hi=4096, integer=True, alias="block"),),
           check=_attnres_check),
    Scheme("gpas", "GPAS: Pre-LN, after each residual add x - SiLU(g) * sg(x) (scaled forward, unscaled gradient); "
           "one gate g per block, 0 at init", "Chen et al. 2025 (arXiv:2506.22049)", _gpas),
    Scheme("siamese", "SiameseNorm: a Pre-Norm-like and a Post-Norm-like stream share every block; each branch "
           "reads N(x + N(y)), adds to y, and / sqrt(2l) to x", "Li et al. 2026 (arXiv:2602.08064)", _siamese,
           build_embed_norm=lambda p, o: N.StreamExpand(2),
           build_final_norm=lambda p, o: N.SiameseCollapse(p.norm(), p.norm(), p.norm())),
    Scheme("hybridnorm", "HybridNorm: x' = x + A(x) with q, k, v normalised per head; y = N(x') + F(N(x'))",
           "Zhuo et al. 2025 (arXiv:2503.04598)", _hybridnorm, check=_own_qk_norm, extras={"own_qk_norm": True},
           options=(choice("first_block", ("hybrid", "pre"), "hybrid",
                           "block 1 like the others, or Pre-Norm with QKV-norm (HybridNorm*)"),)),
]}


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise ConfigError(f"unknown scheme {name!r}; {choices(SCHEMES)}")
    return SCHEMES[name]


def scheme_names(**extras: Any) -> list[str]:
    """Names of the schemes whose ``extras`` hold the given facts (``scheme_names(lns=True)``)."""
    return [n for n, s in SCHEMES.items() if all(s.extras.get(k) == v for k, v in extras.items())]


def scheme_table() -> str:
    """The README's scheme table (markdown), generated from the registry."""
    rows = ["| name | what it is | source | options |", "|---|---|---|---|"]
    for s in SCHEMES.values():
        opts = "; ".join(o.describe() for o in s.options)
        rows.append(f"| `{s.name}` | {s.summary} | {s.source} | {opts} |")
    return "\n".join(rows)


# ============================================================================ scheme variants
# Scheme variants as one string: ``name[:key=value[:key=value]]``, parsed and checked by the registry.
#
#     spec = parse_scheme_spec("lns:position=after-branch")
#     spec.name, spec.options    # "lns", {"position": "after-branch"}
#     spec.label                 # "lns:position=after-branch"   (tables and figures)
#     spec.dirname               # "lns-position-after-branch"   (run directories)
#
# Options are the scheme's own (by name or alias, e.g. ``lns_position``); values are parsed by the option
# (numbers from text). The label lists only options that differ from their defaults, in the registry's
# order, so ``lns:position=after-norm`` and ``lns`` are the same variant.


@dataclass(frozen=True)
class SchemeSpec:
    name: str  # a registry key
    options: dict[str, Any] = field(default_factory=dict)  # canonical: non-default options under their own names

    @property
    def label(self) -> str:
        return self.name + "".join(f":{k}={_text(v)}" for k, v in self.options.items())

    @property
    def dirname(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.label.replace(":", "-").replace("=", "-")).strip("-")


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_scheme_spec(text: str) -> SchemeSpec:
    """``name[:key=value...]`` -> :class:`SchemeSpec`; DepthlabError in one line naming what is wrong
    (an unknown scheme, an unknown option with the scheme's options, a bad value with its choices)."""
    name, *pairs = [p.strip() for p in str(text).strip().split(":")]
    if name not in SCHEMES:
        where = f" in {text!r}" if pairs else ""
        raise ConfigError(f"unknown scheme {name!r}{where}; {choices(SCHEMES)}")
    scheme = get_scheme(name)
    own = ", ".join(o.name for o in scheme.options) or "none"
    given: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        opt = next((o for o in scheme.options if key in (o.name, o.alias)), None)
        if not sep or not key or opt is None:
            what = f"option {key!r}" if sep and key else f"part {pair!r} (want key=value)"
            raise ConfigError(f"unknown {what} in scheme variant {text!r}; scheme {name!r} has options: {own}")
        if opt.name in given:
            raise ConfigError(f"option {opt.name!r} given twice in scheme variant {text!r}")
        try:
            given[opt.name] = opt.parse(f"{name} option {opt.name}", value.strip())
        except ConfigError as err:
            raise ConfigError(f"scheme variant {text!r}: {err}") from None
    return SchemeSpec(name, scheme.canonical(given))
