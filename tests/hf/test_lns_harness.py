"""lm-evaluation-harness on an LNS-patched HF model (HFLM) and its depthlab twin (DepthlabLM)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lm_eval")
transformers = pytest.importorskip("transformers")

from depthlab.hf.convert import from_hf  # noqa: E402
from depthlab.hf.harness import DepthlabLM, evaluate, write_task  # noqa: E402
from depthlab.hf.lns import apply_layernorm_scaling, remove_layernorm_scaling  # noqa: E402
from depthlab.hf.tiny import tiny_model  # noqa: E402

DOCS = [
    {"question": "the sky is", "choices": ["blue", "green", "loud"], "answer": 0},
    {"question": "in the beginning god created the", "choices": ["heaven", "river", "bread"], "answer": 0},
    {"question": "fire is", "choices": ["cold", "hot"], "answer": 1},
    {"question": "the lamb and the", "choices": ["lion", "stone", "sea", "light"], "answer": 0},
    {"question": "bread and", "choices": ["wine", "iron"], "answer": 0},
]


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for d in DOCS for w in (d["question"] + " " + " ".join(d["choices"])).split()})
    vocab = {"<eos>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>",
                                                pad_token="<eos>")


def tiny_llama():
    return tiny_model("llama", vocab_size=64, num_hidden_layers=3, max_position_embeddings=64, initializer_range=0.2,
                      eos_token_id=0, bos_token_id=0, pad_token_id=0)


def scores(results, task="tiny_mc"):
    """Per-choice log-likelihoods, in document order."""
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    return torch.tensor([float(r[0]) for s in samples for r in s["filtered_resps"]])


def test_hflm_on_lns_model_matches_depthlab_lns_twin(tmp_path):
    task_dir = write_task(tmp_path / "tasks", "tiny_mc", DOCS)
    tok = word_tokenizer()
    hf = tiny_llama()
    twin = from_hf(hf, scheme="lns")  # depthlab's own LNS model, same weights
    apply_layernorm_scaling(hf)

    hf_res = evaluate(hf, tok, ["tiny_mc"], include_path=task_dir, batch_size=4, log_samples=True,
                      include_defaults=False)
    ours_res = evaluate(twin, tok, ["tiny_mc"], include_path=task_dir, batch_size=4, log_samples=True,
                      include_defaults=False)
    n_choices = sum(len(d["choices"]) for d in DOCS)
    hf_scores, our_scores = scores(hf_res), scores(ours_res)
    assert len(hf_scores) == n_choices
    torch.testing.assert_close(our_scores, hf_scores, rtol=1e-4, atol=1e-4)
    assert hf_res["results"]["tiny_mc"]["acc,none"] == ours_res["results"]["tiny_mc"]["acc,none"]

    # the LNS hooks are live inside HFLM: the vanilla model scores differently
    remove_layernorm_scaling(hf)
    vanilla = scores(evaluate(hf, tok, ["tiny_mc"], include_path=task_dir, batch_size=4, log_samples=True,
                      include_defaults=False))
    assert (vanilla - hf_scores).abs().max() > 1e-3


def test_depthlab_lm_rolling_and_generation():
    tok = word_tokenizer()
    twin = from_hf(tiny_llama(), scheme="lns")
    lm = DepthlabLM(twin, tok, batch_size=2)

    class Req:  # the part of lm_eval.api.instance.Instance the LM reads
        def __init__(self, *args):
            self.args = args

    text = "the sky is blue and fire is hot"
    (rolling,) = lm.loglikelihood_rolling([Req(text)])
    ids = [tok.eos_token_id] + tok.encode(text, add_special_tokens=False)
    with torch.no_grad():
        logp = torch.log_softmax(twin(torch.tensor([ids[:-1]])).logits[0], -1)
    expected = logp.gather(-1, torch.tensor(ids[1:])[:, None]).sum().item()
    assert rolling == pytest.approx(expected, abs=1e-4)
    (gen,) = lm.generate_until([Req("the sky is", {"until": ["\n"], "max_gen_toks": 3})])
    assert isinstance(gen, str)
