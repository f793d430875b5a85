"""depthlab's dynamic mHC connection equals DeepSeek-V4's, as transformers ships it (``DeepseekV4HyperConnection``),
with the weights copied: the read weights (pre, through the collapsed stream), the write weights (post), the
Sinkhorn-projected mixing matrix (comb) and the connection's output.

DeepSeek-V4 lays its mixing matrix out as [in stream, out stream] and applies ``comb^T @ H``; depthlab's ``res``
is [out stream, in stream] and applies ``res @ H``. So copying the weights transposes the comb block of the
projection and of the bias, and a re-implementation that forgets the transpose (or applies ``comb @ H``) mixes the
streams the wrong way round: the negative control below shows the test would see it. With two Sinkhorn
iterations (far from convergence) the test also pins the order of the normalisations, DeepSeek-V4's: over the
output streams first, then over the input streams (docs/paper.md §9.8)."""

import pytest
import torch

pytest.importorskip("transformers.models.deepseek_v4")
from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config  # noqa: E402
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection  # noqa: E402

from depthlab.models.nn.hyper import DynamicManifoldHyperConnection  # noqa: E402

D, N = 16, 3


def reference(iters: int, eps: float, std: float = 1.0, seed: int = 0) -> DeepseekV4HyperConnection:
    """DeepSeek-V4's connection with random weights (``std`` of the projection: 1 makes comb far from uniform)."""
    hc = DeepseekV4HyperConnection(DeepseekV4Config(hidden_size=D, hc_mult=N, hc_sinkhorn_iters=iters, hc_eps=eps))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        hc.fn.copy_(std * torch.randn(hc.fn.shape, generator=gen))
        hc.base.copy_(torch.randn(hc.base.shape, generator=gen))
        hc.scale.copy_(0.5 + torch.rand(3, generator=gen))
    return hc


def depthlab_copy(hc: DeepseekV4HyperConnection, iters: int, transpose: bool = True) -> DynamicManifoldHyperConnection:
    """depthlab's connection holding ``hc``'s weights: phi = fn^T, alpha = scale, (pre, post, res) = base, the comb
    block of fn and base transposed from [in, out] to [out, in] (``transpose=False``: the bug)."""
    ours = DynamicManifoldHyperConnection(D, N, 0, iters, eps=hc.input_norm.eps, floor=hc.hc_eps)
    fn, base = hc.fn.detach(), hc.base.detach()
    comb_fn, comb_base = fn[2 * N:].view(N, N, N * D), base[2 * N:].view(N, N)
    if transpose:
        comb_fn, comb_base = comb_fn.transpose(0, 1), comb_base.T
    with torch.no_grad():
        ours.phi.copy_(torch.cat((fn[:2 * N], comb_fn.reshape(N * N, N * D))).T)
        ours.alpha.copy_(hc.scale.detach())
        ours.pre.copy_(base[:N])
        ours.post.copy_(base[N:2 * N])
        ours.res.copy_(comb_base.reshape(N, N))
    return ours


def mix(post, comb, H, out):
    """DeepSeek-V4's decoder layer: post ⊗ f(collapsed) + comb^T @ H."""
    return post.unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), H)


@pytest.mark.parametrize("iters,eps", [(2, 1e-6), (20, 1e-6), (20, 0.0)])
def test_dynamic_mhc_equals_deepseek_v4_hyper_connection(iters, eps):
    """DeepSeek-V4's default floor hc_eps = 1e-6 (depthlab's MHC_FLOOR) and none; logits large enough that the
    mixing matrices come near permutations, where the floor matters."""
    hc = reference(iters, eps)
    tol = 1e-6
    ours = depthlab_copy(hc, iters)
    H = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(1))
    W = torch.randn(D, D) / D ** 0.5
    with torch.no_grad():
        post, comb, collapsed = hc(H)
        pre, res, post_ours = ours.weights(H)
        seen = []
        out = ours(H, lambda h: seen.append(h) or h @ W)
    torch.testing.assert_close(post_ours, post, rtol=tol, atol=tol)
    torch.testing.assert_close(res, comb.transpose(-1, -2), rtol=tol, atol=tol)
    torch.testing.assert_close(seen[0], collapsed, rtol=tol, atol=tol)  # what the branch reads: Σ pre_i H_i
    torch.testing.assert_close(out, mix(post, comb, H, collapsed @ W), rtol=tol, atol=tol)
    assert (comb - comb.transpose(-1, -2)).abs().max() > 0.01  # not symmetric: the direction matters


def test_a_transposed_mixing_matrix_is_caught():
    hc = reference(20, 0.0)
    H = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        post, comb, collapsed = hc(H)
        wrong = depthlab_copy(hc, 20, transpose=False)(H, lambda h: h)
    assert (wrong - mix(post, comb, H, collapsed)).abs().max() > 0.05


def test_the_floor_and_the_old_sinkhorn_order_are_caught():
    """Without the floor, or row-first (depthlab's order before it followed DeepSeek-V4), the results differ."""
    hc = reference(20, 1e-6)
    H = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, comb, _ = hc(H)
        unfloored = depthlab_copy(hc, 20)
        unfloored.floor = 0.0
        assert (unfloored.weights(H)[1] - comb.transpose(-1, -2)).abs().max() > 0.01
    hc = reference(2, 0.0)
    ours = depthlab_copy(hc, 2)
    H = torch.randn(2, 5, N, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, comb, _ = hc(H)
        logits = ours.logits(H)[1].float()
        m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
        for _ in range(2):
            m = m / m.sum(-1, keepdim=True)
            m = m / m.sum(-2, keepdim=True)
    assert (m - comb.transpose(-1, -2)).abs().max() > 0.01
