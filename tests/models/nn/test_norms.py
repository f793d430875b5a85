"""``lift_constants``: a compiled model reads LNS's 1/sqrt(l) as data, not as literals (so that its blocks share their
generated kernels), with the same numbers and the same state dict (benchmarks/compile_time.py measures the kernels)."""

from __future__ import annotations

import math

import pytest
import torch

from depthlab import build_model, from_preset
from depthlab.models.nn.norms import LayerNorm, RMSNorm, Scale, lift_constants
from depthlab.train.distributed import LMLoss

SCHEMES = ["lns", "lns:position=before-norm", "lns:position=after-branch"]


def small(scheme: str):
    torch.manual_seed(0)
    return build_model(from_preset("tiny", n_layers=4, d_model=32, n_heads=2, d_ff=64, scheme=scheme))


def graph_code(model: torch.nn.Module, ids: torch.Tensor) -> str:
    """The code of the FX graph dynamo hands to the compiler backend (captured; the graph then runs eagerly)."""
    codes = []

    def backend(gm, _example_inputs):
        codes.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=backend)(ids, ids).loss.backward()
    assert len(codes) == 1  # one graph: no graph break
    return codes[0]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_lifted_constants_keep_the_numbers_and_the_state_dict(scheme):
    model = small(scheme)
    ids = torch.randint(model.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    keys = list(model.state_dict())
    with torch.no_grad():
        before = model(ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            before_bf16 = model(ids).logits
    scaled = [m for m in model.modules() if isinstance(m, (RMSNorm, LayerNorm, Scale)) and m.scale != 1.0]
    assert lift_constants(model) == len(scaled) > 0 and lift_constants(model) == 0  # once only
    assert all(isinstance(m.scale, float) and m.factor.dtype == torch.float32 and m.factor.item() == torch.tensor(m.scale).item()
               for m in scaled)
    assert list(model.state_dict()) == keys  # not persistent: checkpoints do not change
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert torch.equal(model(ids).logits, before_bf16)


def test_scale_of_bf16_activations_keeps_the_float32_factor():
    """A bf16 branch output times the lifted factor equals the product with the float (no bf16-rounded factor)."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    plain, lifted = Scale(1 / math.sqrt(3)), Scale(1 / math.sqrt(3))
    lift_constants(lifted)
    assert lifted(x).dtype == torch.bfloat16 and torch.equal(lifted(x), plain(x))


@pytest.mark.parametrize("scheme", ["lns", "lns:position=before-norm"])
def test_compiled_graph_reads_the_scales_as_inputs_not_literals(scheme):
    model = LMLoss(small(scheme)).train()
    ids = torch.randint(model.model.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    literals = [repr(1 / math.sqrt(layer)) for layer in range(2, 5)]
    assert all(lit in graph_code(model, ids) for lit in literals)  # the literals were there: the test can fail
    lift_constants(model)
    code = graph_code(model, ids)
    assert not any(lit in code for lit in literals)
    assert code.count("factor") >= 3  # blocks 2..4 read theirs as graph inputs
