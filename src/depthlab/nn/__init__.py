"""Building blocks of the models: norms, attention, MLP, residual blocks. No config, no scheme names."""

from depthlab.nn.attention import Attention, RotaryEmbedding
from depthlab.nn.blocks import PostNormBlock, PreNormBlock
from depthlab.nn.mlp import SwiGLU
from depthlab.nn.norms import ChannelGain, GroupRMSNorm, RMSNorm, ScalarGain, Scale

__all__ = [
    "Attention", "RotaryEmbedding", "SwiGLU", "RMSNorm", "GroupRMSNorm", "Scale", "ScalarGain",
    "ChannelGain", "PreNormBlock", "PostNormBlock",
]
