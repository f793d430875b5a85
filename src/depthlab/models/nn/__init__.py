"""Building blocks of the models: norms, attention, MLP, residual blocks, init rules. No config, no scheme
names. Imported lazily (the registry names these classes without loading torch; a model build loads them)."""

from depthlab.base.lazy import lazy_exports

__all__ = [
    "Attention", "RotaryEmbedding", "SwiGLU", "GeluMLP", "RMSNorm", "GroupRMSNorm", "LayerNorm", "GroupLayerNorm",
    "Scale", "ScalarGain", "ChannelGain", "PreNormBlock", "PostNormBlock", "DyT", "Identity", "HyperBlock",
    "HyperConnection", "DynamicHyperConnection", "ManifoldHyperConnection", "DynamicManifoldHyperConnection",
    "StreamExpand", "StreamCollapse", "HybridNormBlock", "GradientPreservingScale", "DepthAttention", "AttnResBlock",
    "SourceExpand", "SourceCollapse", "SiameseBlock", "SiameseCollapse",
]

__getattr__ = lazy_exports(__name__, {
    "Identity": "torch.nn:Identity",  # an off slot
    "DyT": "depthlab.models.nn.dyt",
    **dict.fromkeys(("HyperBlock", "HyperConnection", "DynamicHyperConnection", "ManifoldHyperConnection",
                     "DynamicManifoldHyperConnection", "StreamExpand", "StreamCollapse"), "depthlab.models.nn.hyper"),
    **dict.fromkeys(("Attention", "RotaryEmbedding"), "depthlab.models.nn.attention"),
    **dict.fromkeys(("PostNormBlock", "PreNormBlock", "HybridNormBlock"), "depthlab.models.nn.blocks"),
    **dict.fromkeys(("DepthAttention", "AttnResBlock", "SourceExpand", "SourceCollapse"), "depthlab.models.nn.attnres"),
    **dict.fromkeys(("SiameseBlock", "SiameseCollapse"), "depthlab.models.nn.siamese"),
    "GradientPreservingScale": "depthlab.models.nn.gpas",
    **dict.fromkeys(("GeluMLP", "SwiGLU"), "depthlab.models.nn.mlp"),
    **dict.fromkeys(("ChannelGain", "GroupLayerNorm", "GroupRMSNorm", "LayerNorm", "RMSNorm", "ScalarGain", "Scale"),
                    "depthlab.models.nn.norms"),
})
