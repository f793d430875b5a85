"""Building blocks of the models: norms, attention, MLP, residual blocks. No config, no scheme names."""

from depthlab.nn.attention import Attention, RotaryEmbedding
from depthlab.nn.blocks import PostNormBlock, PreNormBlock
from depthlab.nn.mlp import GeluMLP, SwiGLU
from depthlab.nn.norms import ChannelGain, GroupLayerNorm, GroupRMSNorm, LayerNorm, RMSNorm, ScalarGain, Scale

__all__ = [
    "Attention", "RotaryEmbedding", "SwiGLU", "GeluMLP", "RMSNorm", "GroupRMSNorm", "LayerNorm", "GroupLayerNorm",
    "Scale", "ScalarGain", "ChannelGain", "PreNormBlock", "PostNormBlock",
]
