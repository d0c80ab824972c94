"""The small things a new user meets on the whole path: a dataset already published that this machine did not stage
is replaced only with --overwrite; `--dry-run` needs no tokenizer; the decontamination note compares tasks by what
they resolve to; one console line per checkpoint saved; no torchao noise beside transformers; a small corpus's default
validation split holds about two batches."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from journey_helpers import TRAIN, User, stdlib_documents, write_jsonl
from s3_helpers import apply_env, make_bucket, s3_server

BUCKET = "details"


@pytest.fixture(scope="module")
def bucket():
    with s3_server() as server:
        make_bucket(server, BUCKET)
        yield server


def test_a_published_dataset_this_machine_did_not_stage_is_replaced_only_when_asked(bucket, tmp_path, monkeypatch):
    from dlx.data import storage

    apply_env(bucket, monkeypatch)
    user = User(tmp_path / "user", bucket.env())
    write_jsonl(user.home / "a.jsonl", stdlib_documents(20))
    url = f"s3://{BUCKET}/data"
    user.dlx("prepare", "a.jsonl", "--train-tokenizer", "300", "--out", url, "--no-progress")
    again = user.dlx("prepare", "a.jsonl", "--train-tokenizer", "300", "--out", url, "--no-progress")
    assert "already holds this dataset" in again.stderr  # the same staging folder: nothing to publish
    shutil.rmtree(user.home / ".cache" / "staging")  # another machine, or a cleaned cache
    write_jsonl(user.home / "b.jsonl", stdlib_documents(30))  # other inputs for the same --out
    refused = user.dlx("prepare", "b.jsonl", "--train-tokenizer", "300", "--out", url, "--no-progress", ok=False)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert f"--out {url} already holds a published dataset" in refused.stderr and "--overwrite" in refused.stderr
    before = json.loads(storage.read_bytes(f"{url}/manifest.json"))
    replaced = user.dlx("prepare", "b.jsonl", "--train-tokenizer", "300", "--out", url, "--overwrite", "--no-progress")
    assert f"→ published {url}" in replaced.stderr
    after = json.loads(storage.read_bytes(f"{url}/manifest.json"))
    assert after["complete"] and after["source"]["inputs"] != before["source"]["inputs"]
    listed = {entry["name"] for entry in after["files"]} | {shard["name"] for shard in after["shards"]}
    left = {name for name in storage.listdir(url) if name != "manifest.json"}
    assert left == listed  # the old dataset's files that the new one does not list are gone


def test_a_dry_run_needs_no_tokenizer(tmp_path):
    user = User(tmp_path / "user")
    write_jsonl(user.home / "a.jsonl", stdlib_documents(10))
    dry = user.dlx("prepare", "a.jsonl", "--out", "out", "--dry-run", "--pii", "redact", "--no-progress")
    assert "dry run: 10 documents kept" in dry.stderr
    assert sorted(p.name for p in (user.home / "out").iterdir()) == ["curation-removed.jsonl", "curation.md"]


TASK_YAML = """task: dlx_tiny_leak
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{context}}}}"
doc_to_target: " {{{{answer}}}}"
metric_list:
  - metric: acc
metadata:
  version: 1
"""


def test_the_decontamination_note_compares_tasks_by_what_they_resolve_to(tmp_path):
    """A task given as a YAML file is decontaminated under its task name; a run given the same file finds it."""
    from dlx.data.curate.report import decontamination_note
    from dlx.evals.harness import load_tasks
    from dlx.evals.task_documents import task_documents

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"context": f"question {i}", "answer": "yes"}) + "\n" for i in range(3)))
    task = tmp_path / "leak.yaml"
    task.write_text(TASK_YAML.format(data=json.dumps(str(data))))
    decontaminated = sorted(task_documents([str(task)]))  # what `dlx prepare --decontaminate leak.yaml` records
    assert decontaminated == ["dlx_tiny_leak"]
    request = {"curation": {"decontaminate": {"tasks": decontaminated}}}
    (tmp_path / "manifest.json").write_text(json.dumps({"source": {"request": request}}))
    tasks = load_tasks([str(task)], None, None)  # `eval.tasks: [leak.yaml]`
    assert tasks.names == [str(task)] and tasks.resolved == ["dlx_tiny_leak"]
    assert decontamination_note(tmp_path, tasks.resolved) is None
    assert "not decontaminated" in decontamination_note(tmp_path, tasks.names)  # the old comparison, by path


def test_each_checkpoint_saved_is_one_console_line(tmp_path):
    user = User(tmp_path / "user")
    run = [*TRAIN, "--data.path", "synthetic", "--train.max_steps", "4", "--checkpoint.every", "2", "--eval.every", "0"]
    out = user.dlx("pretrain", *run, "--run-dir", "run").stdout
    saved = [line for line in out.splitlines() if line.startswith("checkpoint step ")]
    assert saved == [f"checkpoint step {step} saved: run/checkpoints/step-{step:08d}" for step in (2, 4)], out


def test_transformers_beside_dlx_prints_no_torchao_noise():
    done = subprocess.run(
        [sys.executable, "-c", "import dlx.train.loop.trainer, transformers; transformers.AutoModelForCausalLM"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "Failed to load" not in done.stderr, done.stderr


def test_a_small_corpus_gets_a_validation_split_of_about_two_batches(tmp_path):
    user = User(tmp_path / "user")
    write_jsonl(user.home / "a.jsonl", stdlib_documents(60))
    user.dlx("prepare", "a.jsonl", "--train-tokenizer", "300", "--out", "data", "--no-progress")
    manifest = json.loads((user.home / "data" / "manifest.json").read_text())
    fraction = manifest["source"]["request"]["val"]["fraction"]
    assert 0.005 < fraction <= 0.1  # raised above the default 0.5 % for a corpus of a few MB
    val = sum(s["tokens"] for s in manifest["shards"] if s["split"] == "val")
    assert val > 2 * 1024  # documents differ in size: about 16 k tokens in expectation, never a handful
