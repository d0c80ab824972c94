"""Downstream evaluation through lm-evaluation-harness and bits per byte: the adapter's per-request log-likelihoods,
rolling log-likelihoods and greedy generations equal lm-eval's own `--model hf` on the `export-hf` of the same
checkpoint (fp32, CPU) and the task metrics are identical; eval.tasks in the loop writes tasks.jsonl equal to
`dlx eval` on the final checkpoint, also on two ranks (fsdp, tp; under tp for a generate_until task too); bad task input
is one line before step 1; the shipped task is deterministic; bpb equals a hand computation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from test_hf_export import corpus_texts, prepare_corpus
from tokenizers import Tokenizer

from dlx.data.token_bytes import TOKEN_BYTES_FILE, read_token_bytes, token_byte_lengths
from dlx.errors import UserError
from dlx.train.config import build_config
from dlx.train.launch import launch
from dlx.train.rundir.checkpoint import load_checkpoint_model
from train_helpers import TINY, run_cli, train_quietly

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.usefixtures("in_process_training")
TASK = "dlx_stdlib_next_line"
LIMIT = 16
TOLERANCE = 1e-4


@pytest.fixture(scope="module", autouse=True)
def task_cache(tmp_path_factory):
    """The shipped task generated into a cache of this module's own (the child processes inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """`dlx prepare` with a byte-level BPE it trains (bos and eos tokens), one validation document."""
    return prepare_corpus(tmp_path_factory.mktemp("prepared"), val_documents=1)


@pytest.fixture(scope="module")
def run_dir(prepared, tmp_path_factory) -> Path:
    """12 steps with validation (bpb) and the shipped task every 6 steps."""
    options = [*TINY, "--data.path", str(prepared), "--data.num_workers", "0", "--train.max_steps", "12"]
    options += ["--eval.every", "6", "--eval.batches", "3", "--eval.tasks", f'["{TASK}"]']
    options += ["--eval.tasks_every", "6", "--eval.tasks_limit", str(LIMIT)]
    return train_quietly(options, tmp_path_factory.mktemp("run") / "run")


@pytest.fixture(scope="module")
def exported(run_dir) -> Path:
    out = run_dir.parent / "hf"
    result = run_cli(["export-hf", str(run_dir), str(out)], run_dir.parent)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def adapters(run_dir, exported):
    """dlx's adapter on the final checkpoint and lm-eval's HFLM on its export, both fp32 on the CPU."""
    pytest.importorskip("accelerate")
    from lm_eval.models.huggingface import HFLM

    from dlx.evals.adapter import build_adapter

    model = load_checkpoint_model(sorted((run_dir / "checkpoints").iterdir())[-1]).eval()
    ours = build_adapter(model, run_dir / "tokenizer.json")
    theirs = HFLM(pretrained=str(exported), dtype="float32", device="cpu", batch_size=8)
    return ours, theirs


def instances(kind: str, arguments: list[tuple]) -> list:
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, args, idx) for idx, args in enumerate(arguments)]


def evaluate_with_samples(lm) -> dict:
    from lm_eval.evaluator import evaluate

    from dlx.evals.harness import load_tasks, offline

    tasks = load_tasks([TASK], None, LIMIT)
    with offline():
        return evaluate(lm, tasks.manager.load(tasks.entries), limit=LIMIT, log_samples=True)


def test_task_log_likelihoods_and_metrics_equal_hflm(adapters):
    ours, theirs = (evaluate_with_samples(lm) for lm in adapters)
    assert ours["results"] == theirs["results"]
    assert ours["results"][TASK]["acc,none"] is not None and "acc_stderr,none" in ours["results"][TASK]
    ours_samples, theirs_samples = ours["samples"][TASK], theirs["samples"][TASK]
    assert len(ours_samples) == LIMIT
    compared = 0
    for a, b in zip(ours_samples, theirs_samples, strict=True):
        assert a["arguments"] == b["arguments"]
        for (logprob_a, greedy_a), (logprob_b, greedy_b) in (
            (ra[0], rb[0]) for ra, rb in zip(a["resps"], b["resps"], strict=True)
        ):
            assert abs(logprob_a - logprob_b) <= TOLERANCE and greedy_a == greedy_b
            compared += 1
    assert compared == 2 * 4 * LIMIT  # each choice after its context and alone (acc_mutual_info)


def test_empty_context_rolling_and_generation_equal_hflm(adapters):
    ours, theirs = adapters
    texts = corpus_texts()
    pairs = [("", "def decode(self, s):"), ("import json\n", "import re"), ("x = 1  ", "+ 2")]
    for a, b in zip(*(lm.loglikelihood(instances("loglikelihood", pairs)) for lm in adapters), strict=True):
        assert abs(a[0] - b[0]) <= TOLERANCE and a[1] == b[1]
    long_texts = [(texts[0][:3000],), (texts[1][:500],)]  # the first spans several 128-token windows
    rolled = [lm.loglikelihood_rolling(instances("loglikelihood_rolling", long_texts)) for lm in adapters]
    assert all(abs(a - b) <= 1e-3 for a, b in zip(*rolled, strict=True)), rolled  # a sum of ~900 terms
    prompts = [("def decode(self, s", {"until": ["\n\n"], "max_gen_toks": 24, "do_sample": False})]
    assert ours.generate_until(instances("generate_until", prompts)) == theirs.generate_until(
        instances("generate_until", prompts)
    )


def test_tasks_in_the_loop_equal_dlx_eval_on_the_final_checkpoint(run_dir, capsys):
    records = [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [6, 12]
    metrics = ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "acc_mutual_info", "acc_mutual_info_stderr")
    assert {f"{TASK}/{metric}" for metric in metrics} <= set(records[-1])
    result = run_cli(["eval", str(run_dir), "--tasks", TASK, "--limit", str(LIMIT), "--json"], run_dir.parent)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)["results"][TASK]
    last = records[-1]
    assert (metrics["acc,none"], metrics["acc_stderr,none"]) == (last[f"{TASK}/acc"], last[f"{TASK}/acc_stderr"])
    from dlx.cli.eval_commands import eval_checkpoint

    eval_checkpoint(run_dir, TASK, limit=LIMIT, device="cpu")  # the table, in this process
    from dlx.evals.stdlib_task import TASK_VERSION

    value, stderr = last[f"{TASK}/acc"], last[f"{TASK}/acc_stderr"]
    row = f"|{TASK}|{TASK_VERSION}|none|0|acc|↑|{value:.4f}|±|{stderr:.4f}|"  # lm-eval's table
    assert row in capsys.readouterr().out.replace(" ", "")


def test_bits_per_byte_equals_a_hand_computation(run_dir, prepared):
    """Σ -log p(target) in bits over the evaluated targets ÷ the UTF-8 bytes those targets decode to (special tokens
    none), from the final checkpoint's whole logits and the tokenizer's own decoding."""
    from dlx.train.build.data import build_eval_loaders

    record = json.loads((run_dir / "eval.jsonl").read_text().splitlines()[-1])
    config = build_config(yaml.safe_load((run_dir / "config.yaml").read_text()))
    model = load_checkpoint_model(sorted((run_dir / "checkpoints").iterdir())[-1]).eval()
    tokenizer = Tokenizer.from_file(str(prepared / "tokenizer.json"))
    special = {tokenizer.token_to_id(t) for t in ("<|begin_of_text|>", "<|end_of_text|>")}
    nats, n_bytes = 0.0, 0
    (loader,) = build_eval_loaders(config, torch.device("cpu")).values()
    for index, (inputs, targets) in enumerate(loader):
        if index == config.eval.batches:
            break
        with torch.no_grad():
            nats += F.cross_entropy(model(inputs).flatten(0, 1).double(), targets.flatten(), reduction="sum").item()
        for row in targets.tolist():
            text_ids = [t for t in row if t not in special]
            n_bytes += len(tokenizer.decode(text_ids, skip_special_tokens=False).encode("utf-8"))
    loader.close()
    assert record["bpb"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)


def test_byte_table_is_exact_and_written_by_prepare(prepared):
    tokenizer_json = (prepared / "tokenizer.json").read_text()
    table = token_byte_lengths(tokenizer_json)
    assert np.array_equal(np.load(prepared / TOKEN_BYTES_FILE), table)
    tokenizer = Tokenizer.from_str(tokenizer_json)
    text = "naïve café ✓ → 数据 def f(x):\n    return x"  # multi-byte characters split across byte-level tokens
    ids = tokenizer.encode(text).ids
    assert int(table[ids].sum()) == len(text.encode("utf-8"))
    eos = tokenizer.token_to_id("<|end_of_text|>")
    assert table[eos] == 0


def test_a_dataset_without_the_table_reads_it_from_its_tokenizer(prepared, tmp_path):
    copy = tmp_path / "old"
    copy.mkdir()
    for path in prepared.iterdir():
        if path.name != TOKEN_BYTES_FILE:
            (copy / path.name).write_bytes(path.read_bytes())
    assert np.array_equal(read_token_bytes(copy), np.load(prepared / TOKEN_BYTES_FILE))
    assert token_byte_lengths(json.dumps({"model": {"type": "Unigram"}, "decoder": {"type": "Metaspace"}})) is None


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ('["no_such_task"]', "eval.tasks: unknown task 'no_such_task'"),
        ('["hub.yaml"]', "eval.tasks: task 'from_the_hub' does not load offline"),
        ('["missing.yaml"]', "eval.tasks: task file missing.yaml does not exist"),
    ],
)
def test_bad_tasks_are_one_line_before_step_one(prepared, tmp_path, monkeypatch, tasks, message):
    (tmp_path / "hub.yaml").write_text(
        "task: from_the_hub\ndataset_path: no-such-org/no-such-dataset\noutput_type: multiple_choice\n"
        "test_split: test\ndoc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: 0\n"
    )
    monkeypatch.chdir(tmp_path)
    options = [*TINY, "--data.path", str(prepared), "--train.max_steps", "2", "--eval.tasks", tasks]
    with pytest.raises(UserError, match=message):
        launch(None, options, tmp_path / "run", resume=False)
    assert not (tmp_path / "run").exists()


def test_without_lm_eval_eval_tasks_is_one_line(prepared, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval raises ImportError
    options = [*TINY, "--data.path", str(prepared), "--train.max_steps", "2", "--eval.tasks", f'["{TASK}"]']
    with pytest.raises(UserError, match=r"eval.tasks needs lm-evaluation-harness: pip install 'dlx\[eval\]'"):
        launch(None, options, tmp_path / "run", resume=False)
    assert not (tmp_path / "run").exists()


def test_tasks_every_without_tasks_is_refused():
    with pytest.raises(UserError, match=r"eval.tasks_every is 5 but eval.tasks is empty"):
        build_config({"eval": {"tasks_every": 5}})


def test_the_shipped_task_is_deterministic_four_way_and_length_blind(tmp_path):
    from dlx.evals.stdlib_task import CHOICES, CONTEXT_LINES, LENGTH_RATIO, next_line_documents, stdlib_functions

    functions = stdlib_functions()
    docs = next_line_documents(functions, 50, seed=0)
    assert docs == next_line_documents(functions, 50, seed=0) and len(docs) == 50
    assert docs != next_line_documents(functions, 50, seed=1)
    contexts = {"\n".join(lines[:CONTEXT_LINES]) + "\n": lines for lines in functions}
    for doc in docs:
        assert len(doc["choices"]) == CHOICES == len(set(doc["choices"]))
        lines = contexts[doc["context"]]  # the context is a function's def line and its first body lines
        answer = doc["choices"][doc["label"]]
        assert answer == lines[CONTEXT_LINES] and lines[0].lstrip().startswith("def ")
        for distractor in doc["choices"]:
            assert len(answer) / LENGTH_RATIO <= len(distractor) <= len(answer) * LENGTH_RATIO  # length does not tell
            assert distractor == answer or distractor not in lines  # a line of another function
    assert 0.1 < np.mean([doc["label"] == 0 for doc in docs]) < 0.45  # the answer's position is shuffled
    indents = [len({len(c) - len(c.lstrip()) for c in doc["choices"]}) for doc in docs]
    assert max(indents) > 1  # distractors are not matched on indentation: it is part of what the task measures


@pytest.mark.distributed
@pytest.mark.parametrize("layout", [["--parallel.strategy", "fsdp"], ["--parallel.tp", "2"]], ids=["fsdp", "tp"])
def test_tasks_on_two_ranks_equal_one_process(prepared, tmp_path, layout):
    """FSDP (the data-parallel ranks split the requests) and tensor parallelism (logits sharded over the vocabulary):
    the metrics of the sharded live model equal `dlx eval` of its final checkpoint in one process."""
    from test_parallel import torchrun

    run_dir = tmp_path / "run"
    options = [*TINY, "--data.path", str(prepared), "--data.num_workers", "0", "--train.max_steps", "2"]
    options += ["--eval.tasks", f'["{TASK}"]', "--eval.tasks_limit", "8", *layout, "--run-dir", str(run_dir)]
    result, _ = torchrun(["pretrain", *options], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    (record,) = [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines()]
    single = run_cli(["eval", str(run_dir), "--tasks", TASK, "--limit", "8", "--json"], tmp_path)
    assert single.returncode == 0, single.stderr
    metrics = json.loads(single.stdout)["results"][TASK]
    for name in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr"):
        assert record[f"{TASK}/{name}"] == metrics[f"{name},none"], name


GENERATE_TASK = "dlx_tiny_generate"
GENERATE_YAML = """task: dlx_tiny_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 12
  do_sample: false
process_results: !function fingerprint.process_results
metric_list:
  - metric: characters
    aggregation: mean
    higher_is_better: true
  - metric: code_points
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1
"""
FINGERPRINT = """def process_results(doc, results):
    # What was generated, as numbers: equal metrics mean equal generations (practically).
    return {"characters": len(results[0]), "code_points": sum(ord(c) * (i + 1) for i, c in enumerate(results[0]))}
"""


def generate_task_dir(folder: Path) -> Path:
    """A local generate_until task (greedy, 12 tokens) whose metrics fingerprint the generated text."""
    folder.mkdir()
    contexts = ["def main(", "import os\n", "class Parser:\n    def", "    return self.", "for line in "]
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps({"context": c, "answer": "x"}) + "\n" for c in contexts))
    (folder / f"{GENERATE_TASK}.yaml").write_text(GENERATE_YAML.format(data=json.dumps(str(data))))
    (folder / "fingerprint.py").write_text(FINGERPRINT)
    return folder


@pytest.mark.distributed
def test_generate_until_under_tensor_parallelism_equals_one_process(prepared, tmp_path):
    """Generation under tp 2 (every rank runs the same forwards; the logits are sharded over the vocabulary) gives the
    generations of `dlx eval` on the final checkpoint in one process."""
    from test_parallel import torchrun

    run_dir, task_dir = tmp_path / "run", generate_task_dir(tmp_path / "tasks")
    options = [*TINY, "--data.path", str(prepared), "--data.num_workers", "0", "--train.max_steps", "2"]
    options += ["--eval.tasks", f'["{GENERATE_TASK}"]', "--eval.task_dir", str(task_dir), "--parallel.tp", "2"]
    result, _ = torchrun(["pretrain", *options, "--run-dir", str(run_dir)], tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    (record,) = [json.loads(line) for line in (run_dir / "tasks.jsonl").read_text().splitlines()]
    single = run_cli(["eval", str(run_dir), "--tasks", GENERATE_TASK, "--task-dir", str(task_dir), "--json"], tmp_path)
    assert single.returncode == 0, single.stderr
    metrics = json.loads(single.stdout)["results"][GENERATE_TASK]
    assert metrics["characters,none"] > 0  # something was generated: the fingerprint is not that of empty strings
    for name in ("characters", "code_points"):
        assert record[f"{GENERATE_TASK}/{name}"] == metrics[f"{name},none"], name


def test_shared_contexts_score_as_whole_rows(adapters):
    """The CPU path (a context once into a KV cache, then its continuations) equals batches of whole rows (the GPU
    and tensor-parallel path) request for request."""
    from dlx.evals.adapter import DlxLM

    ours, _ = adapters

    class WholeRows(DlxLM):
        shares_contexts = False

    whole = WholeRows(ours.model, ours.tokenizer, ours.max_length, ours.prefix_token_id, ours.eos_id)
    context = "    def _remote(self, action):\n        s = self._find_grail_rc()\n"
    pairs = [(context, "        if not s:"), (context, "        return 0"), ("", "import os"), ("x" * 600, " = 1")]
    shared, rows = ours.loglikelihood(instances("loglikelihood", pairs)), whole.loglikelihood(instances("ll", pairs))
    for a, b in zip(shared, rows, strict=True):
        assert abs(a[0] - b[0]) <= TOLERANCE and a[1] == b[1]
    assert ours.shares_contexts and whole.forwards == 1  # one batch of whole rows
