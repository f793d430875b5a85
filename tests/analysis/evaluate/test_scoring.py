"""Scoring: lm-eval's context/continuation split, batched log-likelihoods equal one-by-one naive
ones, acc_norm's length normalisation, lm-eval's standard error, generate-and-match."""

from __future__ import annotations

import math

import torch
from evaldata import ITEMS

from depthlab import build_model, from_preset
from depthlab.analysis.evaluate import encode_pair, extract_answer, logits_fn, mean_stderr, parse_rows, score_loglik
from depthlab.analysis.evaluate.scoring import MCScores, greedy_generate, score_generate
from depthlab.data.tokenizers import ByteTokenizer


def _tiny():
    torch.manual_seed(0)
    return build_model(from_preset("tiny", vocab_size=258, n_layers=2)).eval()


def test_encode_pair_moves_trailing_space_and_splits_the_whole():
    words = {"Answer:": [1], "Answer:X": [1, 2], "Answer: yes": [1, 3, 4], " yes": [9]}
    enc = words.__getitem__
    assert encode_pair(enc, "Answer:", " yes", 0) == ([1], [3, 4])  # not encode(" yes") = [9]
    assert encode_pair(enc, "Answer: ", "yes", 0) == ([1], [3, 4])  # the trailing space moved over
    assert encode_pair(lambda s: [5, 6], "", "yes", 7) == ([7], [5, 6])  # empty context: the prefix token


def test_batched_loglik_equals_naive_per_request():
    model, tok = _tiny(), ByteTokenizer()
    task = parse_rows([(f"t:{i}", r) for i, r in enumerate(ITEMS["piqa"])], "piqa", "test")
    scores = score_loglik(logits_fn(model), task, tok.encode, prefix_id=tok.eos_id, batch_size=3, progress=False)
    for item, lls in zip(task.items, scores.lls):
        for ctx, cont, ll in zip(item.contexts, item.continuations, lls):
            c, x = tok.encode(ctx), tok.encode(cont)
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([c + x])).logits[0].double(), -1)
            naive = sum(float(logp[len(c) - 1 + k, t]) for k, t in enumerate(x))
            assert math.isclose(ll, naive, abs_tol=1e-4)
    one = score_loglik(logits_fn(model), task, tok.encode, prefix_id=tok.eos_id, batch_size=1, progress=False)
    assert torch.allclose(torch.tensor(one.lls), torch.tensor(scores.lls), atol=1e-5)


def test_truncation_keeps_the_continuation():
    model, tok = _tiny(), ByteTokenizer()
    rows = [("t:1", {"context": "x" * 50, "choices": ["abc", "abd"], "answer": 0})]
    task = parse_rows(rows, "t", "test")
    s = score_loglik(logits_fn(model), task, tok.encode, prefix_id=tok.eos_id, max_length=10, progress=False)
    assert all(math.isfinite(x) for x in s.lls[0])


def test_acc_norm_divides_by_choice_length_and_stderr_is_lm_evals():
    rows = [(f"t:{i}", {"context": "q", "choices": ["a", "bbbbbbbbbb"], "answer": 1}) for i in range(3)]
    task = parse_rows(rows, "t", "test")
    m = MCScores([[-2.0, -5.0], [-2.0, -5.0], [-9.0, -5.0]], task).metrics()
    # acc: argmax picks "a" twice -> 1/3; acc_norm: -5/10 beats -2/1 every time -> 1
    assert m["n"] == 3 and math.isclose(m["acc"], 1 / 3) and m["acc_norm"] == 1.0
    assert math.isclose(m["acc_stderr"], math.sqrt((2 * (1 / 3) ** 2 + (2 / 3) ** 2) / 2) / math.sqrt(3))
    assert m["acc_norm_stderr"] == 0.0 and math.isnan(mean_stderr([1.0]))


def test_extract_answer_takes_the_first_answer_word():
    words = ("answer1", "answer2", "answer3")
    assert extract_answer("the correct answer is answer2", words) == 1
    assert extract_answer("answer3 or answer1", words) == 2
    assert extract_answer("no idea", words) is None
    assert extract_answer("true", ("false", "true")) == 1


def test_batched_greedy_generation_equals_one_by_one():
    model, tok = _tiny(), ByteTokenizer()
    prompts = [tok.encode("In the beginning"), tok.encode("And God said, Let there be")]
    together = greedy_generate(logits_fn(model), prompts, max_new_tokens=5, pad_id=tok.pad_id)
    alone = [greedy_generate(logits_fn(model), [p], max_new_tokens=5)[0] for p in prompts]
    assert together == alone and all(len(g) == 5 for g in together)


def test_score_generate_matches_extracted_words():
    task = parse_rows([("t:1", {"context": "q", "choices": ["a", "b"], "answer": 1})], "t", "test")
    fake = {"text": "the correct answer is answer2"}

    def fn(ids):  # a "model" that always emits token 0
        out = torch.zeros(ids.shape[0], ids.shape[1], 4)
        out[..., 0] = 1.0
        return out

    res = score_generate(fn, task, lambda s: [1, 2], lambda ids: fake["text"], lambda ins: ins, eos_id=None,
                         max_new_tokens=2, progress=False)
    assert res["acc"] == 1.0 and res["outputs"][0]["pred"] == 1
    fake["text"] = "answer1"
    assert score_generate(fn, task, lambda s: [1], lambda ids: fake["text"], lambda ins: ins, eos_id=None,
                          max_new_tokens=1, progress=False)["acc"] == 0.0


def test_codec_bos_for_hf_models_only(tiny_hf_dir):
    from transformers import AutoTokenizer

    from depthlab.analysis.evaluate.accuracy import Codec
    from depthlab.data.tokenizers import AutoTokenizerWrapper
    from depthlab.targets import Target

    tok = AutoTokenizerWrapper(AutoTokenizer.from_pretrained(tiny_hf_dir), f"hf:{tiny_hf_dir}")
    hf = Codec(Target(_tiny(), "m", "hf-causal-lm", tok))
    ours = Codec(Target(_tiny(), "m", "depthlab", tok))  # a depthlab run trained with an hf: tokenizer
    assert hf.encode("the sun")[0] == 0 == hf.prefix_id  # BOS, as lm-eval's HFLM encodes
    assert ours.encode("the sun") == tok.encode("the sun") and ours.encode("the sun")[0] != 0
