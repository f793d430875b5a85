"""depthlab's acc / acc_norm equal lm-evaluation-harness's own, item by item, on the same local jsonl
files and the same tiny random HF Llama (scored by lm-eval's HFLM from the saved directory).

lm-eval's task configs here *include* its bundled yamls (arc_easy, openbookqa, piqa, hellaswag,
boolq, winogrande, social_iqa) and only swap the dataset for a local json file, so the prompts,
process_docs and doc_to_* functions are lm-eval's. Runs offline (HF_*_OFFLINE=1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

from depthlab.analysis.evaluate import builtin_mc_rows, evaluate, load_task_file, score_loglik  # noqa: E402
from depthlab.analysis.evaluate.accuracy import Codec  # noqa: E402
from depthlab.targets import load_target  # noqa: E402 - after the importorskip

LM_EVAL_TASKS = {  # our format -> lm-eval's bundled yaml (relative to lm_eval/tasks)
    "arc": "arc/arc_easy.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
    "piqa": "piqa/piqa.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
    "boolq": "super_glue/boolq/default.yaml",
    "winogrande": "winogrande/default.yaml",
    "siqa": "siqa/siqa.yaml",
}


GENERIC = (  # our generic {"context", "choices", "answer"} format as an lm-eval task
    "output_type: multiple_choice\n"
    'doc_to_text: "{{context}}"\n'
    'doc_to_choice: "{{choices}}"\n'
    'doc_to_target: "{{answer}}"\n'
    "metadata:\n"
    "  version: 1.0\n"
)


def _local_yaml(directory: Path, fmt: str, data: Path) -> str:
    name = f"local_{fmt}"
    head = GENERIC if fmt == "generic" else f"include: {Path(lm_eval.__file__).parent / 'tasks' / LM_EVAL_TASKS[fmt]}\n"
    (directory / f"{name}.yaml").write_text(
        head +
        f"task: {name}\n"
        "tag: []\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {data}\n"
        "training_split: null\n"
        "validation_split: null\n"
        "test_split: test\n"
        "metric_list:\n"
        "  - metric: acc\n"
        "  - metric: acc_norm\n"
    )
    return name


def test_acc_and_acc_norm_match_lm_eval(tmp_path, task_files, tiny_hf_dir, monkeypatch):
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "ds-cache"))
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    task_files = {**task_files, "generic": tmp_path / "generic.jsonl"}
    task_files["generic"].write_text("".join(json.dumps(r) + "\n" for r in builtin_mc_rows()[:24]))
    ydir = tmp_path / "yamls"
    ydir.mkdir()
    names = {fmt: _local_yaml(ydir, fmt, path) for fmt, path in task_files.items()}
    ref = simple_evaluate(model="hf", model_args=f"pretrained={tiny_hf_dir},dtype=float32", device="cpu",
                         tasks=list(names.values()), batch_size=4, log_samples=True,
                         task_manager=TaskManager(include_path=str(ydir), include_defaults=False))

    target = load_target(str(tiny_hf_dir))
    codec = Codec(target)
    ours = evaluate(target, [str(p) for p in task_files.values()], batch_size=3, progress=False)
    for fmt, name in names.items():
        theirs, mine = ref["results"][name], ours[fmt]
        print(f"{fmt}: n={mine['n']} depthlab acc={mine['acc']:.4f} acc_norm={mine['acc_norm']:.4f} | lm-eval "
              f"acc={theirs['acc,none']:.4f} acc_norm={theirs['acc_norm,none']:.4f} "
              f"acc_stderr={theirs['acc_stderr,none']} vs {mine['acc_stderr']}")
        assert mine["n"] == len(ref["samples"][name])
        for metric in ("acc", "acc_norm"):
            assert mine[metric] == pytest.approx(theirs[f"{metric},none"], abs=1e-9), (fmt, metric)
            se = theirs[f"{metric}_stderr,none"]
            if isinstance(se, float) and not math.isnan(se):
                assert mine[f"{metric}_stderr"] == pytest.approx(se, rel=1e-6), (fmt, metric)
        # and the log-likelihoods themselves, request by request
        samples = sorted(ref["samples"][name], key=lambda s: s["doc_id"])
        ref_lls = [float(r[0]) for s in samples for r in s["filtered_resps"]]
        lls = score_loglik(target.forward_fn(), load_task_file(task_files[fmt]), codec.encode,
                           prefix_id=codec.prefix_id, progress=False).lls
        assert [x for row in lls for x in row] == pytest.approx(ref_lls, abs=1e-4), fmt
