"""Data: corpora (documents + held-out split), tokenizers, packing/padding, token shards.

    from depthlab.data import iter_documents, build_tokenizer, eval_token_batches
    tok = build_tokenizer("bpe:4096", iter_documents("builtin", "train"))
    for batch in eval_token_batches("builtin", tok, n_tokens=65536, seq_len=256, batch_size=8):
        ...  # LongTensor (B, 256) of held-out text
"""

from depthlab.base.lazy import lazy_exports

DEFAULT_TOKENIZER = "bpe:4096"  # for --data builtin and local corpora: small vocab, cached

__all__ = [
    "iter_documents", "build_tokenizer", "load_tokenizer", "eval_token_batches", "EvalBatches", "Tokenizer",
    "ByteTokenizer", "TokenSequences", "load_sequences", "pack_tokens", "pad_tokens", "inputs_and_labels",
    "write_shards", "shard_meta", "is_shard_dir", "check_tokenizer_spec", "default_cache_dir", "builtin_path",
    "is_val_document", "BUILTIN_VAL_BOOKS", "VAL_FRACTION", "IGNORE_INDEX", "DEFAULT_TOKENIZER",
    "NAMED_CORPORA", "shard_path", "CausalLMWindows",
]

__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("NAMED_CORPORA", "shard_path"), "depthlab.data.named"),
    **dict.fromkeys((
        "IGNORE_INDEX", "CausalLMWindows", "EvalBatches", "TokenSequences", "eval_token_batches", "inputs_and_labels",
        "load_sequences", "pack_tokens", "pad_tokens"), "depthlab.data.batches"),
    **dict.fromkeys(("is_shard_dir", "shard_meta", "write_shards"), "depthlab.data.shards"),
    **dict.fromkeys((
        "BUILTIN_VAL_BOOKS", "VAL_FRACTION", "builtin_path", "is_val_document", "iter_documents"), "depthlab.data.corpora"),
    **dict.fromkeys((
        "ByteTokenizer", "Tokenizer", "build_tokenizer", "check_tokenizer_spec", "default_cache_dir",
        "load_tokenizer"), "depthlab.data.tokenizers"),
})
