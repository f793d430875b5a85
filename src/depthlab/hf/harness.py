"""lm-evaluation-harness for depthlab models and LNS-patched Hugging Face models (extra ``lm-eval``).

    from depthlab.hf.harness import evaluate, harness_lm, write_task
    task_dir = write_task("tasks/", "tiny_mc", docs)            # a local multiple-choice task
    results = evaluate(model, tokenizer, ["tiny_mc"], include_path=task_dir)
    results["results"]["tiny_mc"]["acc,none"]

``model`` is a depthlab ``DecoderLM`` (any scheme) or a transformers causal LM, with LNS applied or
not; ``tokenizer`` a depthlab tokenizer or a transformers tokenizer. An HF model with an HF
tokenizer is scored by lm-eval's own ``HFLM`` (given the model *object*, so the LNS hooks are
live); everything else by :class:`DepthlabLM`, a small ``TemplateLM`` that calls the model's
forward. Never pass the *path* of an LNS checkpoint to ``lm_eval --model hf``: HFLM loads it with
plain ``from_pretrained``, which silently drops LNS — load it with ``depthlab.hf.load`` or export it
with ``fold_layernorm_scaling`` first.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.base.extras import needs

log = logging.getLogger(__name__)

try:  # optional extra: everything below needs it
    from lm_eval import utils as _lm_utils
    from lm_eval.api.model import TemplateLM
except ImportError:  # pragma: no cover - exercised only without the extra
    TemplateLM = object  # type: ignore[assignment,misc]
    _lm_utils = None


def _require_lm_eval() -> None:
    if _lm_utils is None:
        raise needs("the lm-evaluation-harness adapter", "lm-eval")


class _Tok:
    """One interface over a depthlab Tokenizer and a transformers tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        hf = _is_hf_tokenizer(tokenizer)
        self.eos_id = tokenizer.eos_token_id if hf else tokenizer.eos_id
        if self.eos_id is None:
            raise DepthlabError("the tokenizer has no end-of-sequence token; lm-eval needs one")
        self._encode = (lambda s: tokenizer.encode(s, add_special_tokens=False)) if hf else tokenizer.encode

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))


class DepthlabLM(TemplateLM):
    """lm-eval ``LM`` over any causal model whose ``forward(input_ids)`` returns ``.logits``
    (depthlab ``DecoderLM`` or a transformers model): log-likelihoods, rolling log-likelihoods
    (perplexity tasks) and greedy generation (no KV cache: meant for small models and tasks)."""

    def __init__(self, model: nn.Module, tokenizer: Any, batch_size: int = 8, max_length: int | None = None,
                 max_gen_toks: int = 64) -> None:
        _require_lm_eval()
        super().__init__()
        self.model = model.eval()
        self.tok = _Tok(tokenizer)
        self.batch_size = int(batch_size)
        self.max_gen_toks = max_gen_toks
        cfg = getattr(model, "cfg", None)
        default = getattr(cfg, "max_seq_len", None) or getattr(getattr(model, "config", None), "max_position_embeddings", 2048)
        self.max_length = int(max_length or default)
        self._device = next(model.parameters()).device

    # ------------------------------------------------------------------ TemplateLM interface
    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        return self.tok.decode(tokens)

    @torch.no_grad()
    def _logprobs(self, rows: list[list[int]]) -> torch.Tensor:
        """Right-padded batch (B, T) -> log-probabilities (B, T, V); causal, so padding is inert."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.eot_token_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.as_tensor(r)
        return F.log_softmax(self.model(ids.to(self._device)).logits.float(), dim=-1).cpu()

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        results: list[tuple[float, bool]] = []
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            rows, conts = [], []
            for _, context, continuation in chunk:
                whole = (list(context) + list(continuation))[-(self.max_length + 1):]
                rows.append(whole[:-1])  # inputs; position t predicts whole[t + 1]
                conts.append(list(continuation))
            logprobs = self._logprobs(rows)
            for i, cont in enumerate(conts):
                n = len(rows[i])
                lp = logprobs[i, n - len(cont) : n]  # (len(cont), V)
                target = torch.as_tensor(cont)
                score = lp.gather(-1, target[:, None]).sum().item()
                greedy = bool((lp.argmax(-1) == target).all())
                results.append((score, greedy))
                self.cache_hook.add_partial("loglikelihood", chunk[i][0], (score, greedy))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in [req.args for req in requests]:
            windows = [
                (None, *_lm_utils.make_disjoint_window(w))
                for w in _lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1,
                )
            ]
            out.append(sum(score for score, _ in self._loglikelihood_tokens(windows)))
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen_kwargs in [req.args for req in requests]:
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            ids = self.tok_encode(context) or [self.prefix_token_id]
            new: list[int] = []
            text = ""
            for _ in range(max_new):
                window = (ids + new)[-self.max_length:]
                nxt = int(self._logprobs([window])[0, -1].argmax())
                if nxt == self.eot_token_id:
                    break
                new.append(nxt)
                text = self.tok_decode(new)
                if any(stop in text for stop in until):
                    break
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


def _is_hf_model(model: nn.Module) -> bool:
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel)


def _is_hf_tokenizer(tokenizer: Any) -> bool:
    from transformers import PreTrainedTokenizerBase

    return isinstance(tokenizer, PreTrainedTokenizerBase)


def harness_lm(model: nn.Module, tokenizer: Any, batch_size: int = 8, max_length: int | None = None) -> Any:
    """An lm-eval ``LM`` scoring ``model``: lm-eval's ``HFLM`` for a transformers model with a
    transformers tokenizer (LNS hooks stay live: the model object is passed, not a path), else
    :class:`DepthlabLM`."""
    _require_lm_eval()
    if _is_hf_model(model) and _is_hf_tokenizer(tokenizer):
        from lm_eval.models.huggingface import HFLM

        return HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=batch_size, max_length=max_length,
                    device=str(model.device))
    return DepthlabLM(model, tokenizer, batch_size=batch_size, max_length=max_length)


def evaluate(model: nn.Module, tokenizer: Any, tasks: Sequence[str], *, include_path: str | Path | None = None,
             batch_size: int = 8, max_length: int | None = None, limit: int | float | None = None,
             num_fewshot: int | None = None, include_defaults: bool = True,
             **simple_evaluate_kwargs: Any) -> dict[str, Any]:
    """Run lm-eval ``tasks`` on ``model``; ``include_path`` adds local task yamls (see
    :func:`write_task`); ``include_defaults=False`` skips indexing lm-eval's thousands of built-in
    tasks (much faster when only local tasks are used). Returns lm-eval's results dict
    (``results[task]["acc,none"]``, ...)."""
    _require_lm_eval()
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(include_path) if include_path else None, include_defaults=include_defaults)
    return simple_evaluate(
        model=harness_lm(model, tokenizer, batch_size=batch_size, max_length=max_length), tasks=list(tasks),
        task_manager=manager, limit=limit, num_fewshot=num_fewshot, **simple_evaluate_kwargs,
    )


def write_task(directory: str | Path, name: str, docs: Iterable[dict[str, Any]]) -> Path:
    """Write a local multiple-choice lm-eval task: ``{name}.jsonl`` with one document per line
    (``{"question": str, "choices": [str, ...], "answer": int}``) and ``{name}.yaml`` (metrics
    acc and acc_norm). Returns ``directory``, to pass as ``include_path``."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{name}.jsonl"
    rows = list(docs)
    for i, doc in enumerate(rows):
        if set(doc) < {"question", "choices", "answer"} or not 0 <= int(doc["answer"]) < len(doc["choices"]):
            raise DepthlabError(f"task {name!r} document {i}: need question, choices and an answer index into choices")
    data.write_text("".join(json.dumps(d) + "\n" for d in rows))
    (directory / f"{name}.yaml").write_text(
        f"task: {name}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {json.dumps(str(data))}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n"
        "  - metric: acc\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
        "  - metric: acc_norm\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
        "metadata:\n"
        "  version: 1.0\n"
    )
    return directory


__all__ = ["DepthlabLM", "harness_lm", "evaluate", "write_task"]
