"""The Hugging Face decoder families depthlab reads, writes and scales: one list for all of ``depthlab.hf``.

All share the Llama decoder-layer layout (``model.layers[i].{input_layernorm, self_attn, post_attention_layernorm,
mlp}``, RMSNorm computing ``weight * normalize(x)``, SwiGLU): Qwen2 adds q/k/v biases, Qwen3 adds per-head
QK-norm (``self_attn.{q,k}_norm``), Mistral is Llama with an optional sliding window.
"""

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3")
