"""Trust, round 3: a killed rank is named by its peers, and the other items of this round that need no model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch.distributed as dist

from dlx.parallel.heartbeat import PROCESS_KEY, Heartbeat, RankLost
from prepare_helpers import tiny_tokenizer

__all__ = ["tiny_tokenizer"]

CLOSED = "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40123"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_sigkilled_rank_is_named_by_every_survivor(world_size):
    """The last rank is SIGKILLed mid-step: its tick is still fresh when the survivors' collectives fail at once with
    "Connection closed by peer", and it announced nothing. Each survivor names it (its pid is gone on this host), not
    its own error, and with 3 ranks the second survivor does not name the first, which left after its own explain."""
    store = dist.HashStore()
    ranks = [Heartbeat(store, rank, world_size, timeout_s=600.0) for rank in range(world_size)]
    killed = world_size - 1
    try:
        for heartbeat in ranks:
            heartbeat.beat(4, "forward and backward")
        process = json.loads(store.get(PROCESS_KEY.format(killed)))
        store.set(PROCESS_KEY.format(killed), json.dumps({**process, "pid": dead_pid()}))
        for survivor in ranks[:killed]:
            lost = survivor.explain(RuntimeError(CLOSED))
            assert isinstance(lost, RankLost), lost
            text = str(lost)
            assert text.startswith(
                f"a collective failed on rank {survivor.rank} at step 4, forward and backward: rank {killed} failed: "
                "its process is gone (killed: SIGKILL, the out-of-memory killer or its node lost) at step 4, forward "
                "and backward (pid "
            )
            assert text.count("rank ") == 2 and text.endswith(f"(the collective's error: RuntimeError: {CLOSED})")
    finally:
        for heartbeat in ranks:
            heartbeat.close()


def test_a_killed_rank_on_another_host_is_named_when_its_heartbeat_stops():
    """On another host the pid cannot be read: the survivor waits (at most STALE_S + TICK_S) for the peer's tick to
    go stale, then names it."""
    store = dist.HashStore()
    ranks = [Heartbeat(store, rank, 2, timeout_s=600.0) for rank in range(2)]
    try:
        ranks[1].beat(2, "loss all-reduce")
        store.set(PROCESS_KEY.format(1), json.dumps({"pid": 4242, "host": "node-b"}))
        ranks[1].close()  # its ticker stops, as a killed process's does
        lost = ranks[0].explain(RuntimeError(CLOSED))
        assert isinstance(lost, RankLost), lost
        assert "rank 1 failed: its heartbeat stopped (killed: " in str(lost)
        assert "at step 2, loss all-reduce (pid 4242 on node-b)" in str(lost)
    finally:
        ranks[0].close()


WUDAO_KEYS = ("id", "uniqueKey", "titleUkey", "dataType", "title", "content")


def write_wudao(path, texts: list[str]):
    """WuDao's layout: one JSON array per file, the text in `content`."""
    records = [
        dict(zip(WUDAO_KEYS, (i, f"k{i}", f"t{i}", "news", f"title {i}", text), strict=True))
        for i, text in enumerate(texts)
    ]
    path.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return path


WUDAO_HINT = (
    "the records have no 'text' field (their fields: id, uniqueKey, titleUkey, dataType, title, content); give "
    "--text-field content"
)


def test_tokenizer_extend_reads_wudao_json_with_text_field(tmp_path):
    """`dlx tokenizer extend` takes `dlx prepare`'s --text-field: WuDao's JSON arrays give their `content`; without
    the option, the line names the field it looked for, the records' fields, and the option to give."""
    from cpt_helpers import base_tokenizer, chinese_text
    from dlx.data.tokenizer_extend import extend_tokenizer
    from dlx.errors import UserError

    base = base_tokenizer(tmp_path / "base" / "tokenizer.json")
    corpus = write_wudao(tmp_path / "part-0.json", [chinese_text(200, seed=s) for s in range(5)])
    with pytest.raises(UserError) as refused:
        extend_tokenizer(base, [str(corpus)], 20, tmp_path / "plain", sample_chars=10**6)
    assert str(refused.value) == f"the corpus {corpus} holds no text: {WUDAO_HINT}"
    assert not (tmp_path / "plain").exists()
    result = extend_tokenizer(base, [str(corpus)], 20, tmp_path / "out", sample_chars=10**6, text_field="content")
    assert result.added == 20 and result.after.tokens < result.before.tokens


def test_prepare_without_text_field_names_the_field_and_the_fix(tmp_path, tiny_tokenizer):
    from dlx.data.prepare.pipeline import prepare_dataset
    from dlx.errors import UserError

    corpus = write_wudao(tmp_path / "part-0.json", [f"document number {i} of the corpus" for i in range(30)])
    with pytest.raises(UserError) as refused:
        prepare_dataset([str(corpus)], tmp_path / "out", tokenizer=tiny_tokenizer, workers=1, progress=False)
    assert str(refused.value) == (
        f"no documents found in 1 input file(s) (30 bad records, 0 empty documents): {WUDAO_HINT}"
    )


TORCH_LOADED = """
import sys
from dlx.cli.app import main
sys.argv = ["dlx", "pretrain", sys.argv[1]]
try:
    main()
except SystemExit as e:
    print(f"exit {e.code}; torch loaded: {'torch' in sys.modules}")
"""


def test_a_bad_recipe_key_is_answered_before_torch_is_loaded(tmp_path):
    """Loading torch takes seconds (8-11 s on a busy machine): a recipe error is found before it."""
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model: {preset: debug}\ntrain: {max_stepz: 3}\n")
    proc = subprocess.run([sys.executable, "-c", TORCH_LOADED, str(recipe)], capture_output=True, text=True, timeout=60)
    assert proc.stderr.startswith("error: recipe: unknown key 'train.max_stepz'; train keys are max_steps,")
    assert proc.stdout.strip() == "exit 2; torch loaded: False"


def test_an_error_alike_on_every_rank_is_printed_by_rank_0_with_the_retry(monkeypatch, capsys):
    """A second job refused by the run lock (rank 0 decides for every rank) under `torchrun --max-restarts 2`: one
    line per attempt, from rank 0, saying whether the launcher retries; a rank's own error is printed by that rank."""
    from dlx.cli.app import print_user_error
    from dlx.errors import UserError
    from dlx.train.build.step_plan import resolve_grad_accum
    from dlx.train.config import RunConfig

    refusal = UserError("run folder r is being trained by pid 7 on vm (lock r/writer.lock)").alike_on_every_rank()
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    expected = {
        ("0", "0"): "error: run folder r is being trained by pid 7 on vm (lock r/writer.lock) (torchrun attempt 1 of "
        "3: the launcher will retry)\n",
        ("1", "0"): "",
        ("0", "2"): "error: run folder r is being trained by pid 7 on vm (lock r/writer.lock) (torchrun attempt 3 of "
        "3, the last)\n",
    }
    for (rank, restarts), line in expected.items():
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restarts)
        print_user_error(refusal)
        assert capsys.readouterr().err == line, (rank, restarts)
    monkeypatch.setenv("RANK", "1")
    print_user_error(UserError("shard x is damaged"))  # this rank's own: printed where it happened
    assert capsys.readouterr().err.startswith("error: shard x is damaged (torchrun attempt 3 of 3")
    config = RunConfig.model_validate(
        {"train": {"global_batch_size": 12, "max_steps": 2}, "data": {"micro_batch_size": 4}}
    )
    with pytest.raises(UserError) as elastic:
        resolve_grad_accum(config, 2)  # an elastic resume on 2 ranks: 12 is not a multiple of 4 × 2
    assert elastic.value.every_rank


def test_a_stale_lock_from_another_host_is_taken_over_with_a_line(tmp_path, capsys):
    import time

    from dlx.train.rundir.runlock import LOCK_FILE, STALE_S, RunLock

    holder = {"pid": 4242, "host": "node-b", "started": 0.0, "alive": time.time() - STALE_S - 30}
    (tmp_path / LOCK_FILE).write_text(json.dumps(holder) + "\n")
    lock = RunLock(tmp_path)
    lock.acquire()
    try:
        err = capsys.readouterr().err
        assert err.startswith(f"run folder {tmp_path}: took over the stale lock of pid 4242 on node-b (no refresh for ")
        assert err.endswith("s; a holder on another host counts for 120 s after its last)\n")
        assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] != "node-b"
    finally:
        lock.release()


def test_a_resume_with_keep_last_1_needs_room_for_one_more_checkpoint(tmp_path, monkeypatch):
    """The resumed run's checkpoint is on the disk already: keep_last 1 needs room for the one a save adds."""
    import shutil
    from collections import namedtuple

    from dlx.errors import UserError
    from dlx.train.build.preflight import check_disk, checkpoint_bytes
    from dlx.train.recipe import load_recipe
    from train_helpers import TINY

    config = load_recipe(
        None, [*TINY, "--train.max_steps", "4", "--checkpoint.every", "2", "--checkpoint.keep_last", "1"]
    )
    size = checkpoint_bytes(config)
    (tmp_path / "checkpoints" / "step-00000002").mkdir(parents=True)
    usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * size, 9 * size, size + size // 2))
    found, note = check_disk(config, tmp_path, resume=True)
    assert found.startswith("1 checkpoint(s) of ~") and note is None
    with pytest.raises(UserError, match=r"less than 2 checkpoint\(s\) of ~"):
        check_disk(config, tmp_path / "fresh", resume=False)


def test_sigterm_during_start_up_exits_143_with_a_line(tmp_path):
    from dlx.faults import marker_name
    from fault_helpers import finish, start_cli, wait_for_file
    from train_helpers import TINY

    env = {**os.environ, "DLX_FAULT_PAUSE": "start_up", "DLX_FAULT_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = start_cli(["pretrain", *TINY, "--train.max_steps", "2", "--run-dir", str(tmp_path / "run")], tmp_path, env)
    wait_for_file(tmp_path / marker_name("start_up"), proc)
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc)
    assert proc.returncode == 143
    assert err.strip() == "SIGTERM received outside the training loop (start-up or the end): stopped; exit 143"
    assert not (tmp_path / "run").exists()


def test_a_truncated_shard_is_not_complete_and_verify_names_the_fix(tmp_path):
    from train_helpers import make_dataset, run_cli

    data = make_dataset(tmp_path / "data", val=False)
    shard = sorted(data.glob("train-*.bin"))[0]
    with shard.open("r+b") as f:
        f.truncate(shard.stat().st_size - 2)
    info = run_cli(["data", "info", str(data)], tmp_path)
    assert info.stdout.splitlines()[0] == (
        f"{data}: DAMAGED ({shard.name} missing or not of the size the manifest records; run `dlx data verify {data}`)"
    )
    verify = run_cli(["data", "verify", str(data)], tmp_path)
    assert verify.returncode == 1
    assert verify.stderr.splitlines()[-1].startswith(
        "fix: the dataset cannot be trained on as it is: run `dlx prepare`"
    )


def test_each_function_a_task_loads_is_named_in_one_line(tmp_path, capsys):
    """lm-eval's `!function` imports Python from the task YAML's folder: one line names each, for a task given as a
    YAML path and for one found in a task folder (eval.task_dir, `dlx eval --task-dir`)."""
    pytest.importorskip("lm_eval")
    from test_evals import GENERATE_TASK, generate_task_dir

    from dlx.evals.harness import load_tasks

    folder = generate_task_dir(tmp_path / "tasks")
    load_tasks([GENERATE_TASK], str(folder), limit=1)
    yaml_file, module = (folder / f"{GENERATE_TASK}.yaml").resolve(), (folder / "fingerprint.py").resolve()
    line = f"{yaml_file} runs Python: !function fingerprint.process_results imports {module}"
    assert named(capsys.readouterr().err) == [f"task {GENERATE_TASK}: {line}"]
    load_tasks([str(folder / f"{GENERATE_TASK}.yaml")], None, limit=1)
    assert named(capsys.readouterr().err) == [f"task {folder / GENERATE_TASK}.yaml: {line}"]


def named(err: str) -> list[str]:
    return [line for line in err.splitlines() if "!function" in line]  # not datasets' progress bars


def test_the_chunked_loss_holds_one_chunk_of_logits_at_a_time(monkeypatch):
    """Each chunk's logits (n × vocab, fp32: 1.05 GB at 2,048 tokens × 128,256) are freed before the next chunk's
    are made, with and without gradients; a chunk kept alive across the next one doubled the loss's peak."""
    import weakref

    import torch

    from dlx.model import loss as loss_mod

    alive_at_next: list[bool] = []
    previous: list[weakref.ref] = []

    def watch(tensor: torch.Tensor) -> None:
        if previous:
            alive_at_next.append(previous[-1]() is not None)
        previous.append(weakref.ref(tensor))

    def math_watched(logits, targets, z_loss, scale):
        watch(logits)  # the gradient is made in place of the logits: the same storage
        return loss_mod.chunk_loss_and_grad(logits, targets, z_loss, scale)

    chunk_loss = loss_mod.chunk_loss

    def chunk_loss_watched(logits, targets):
        watch(logits)
        return chunk_loss(logits, targets)

    hidden = torch.randn(2, 24, 8, requires_grad=True)
    output, targets = torch.nn.Linear(8, 64, bias=False), torch.randint(0, 64, (2, 24))
    outputs = loss_mod.OutputLoss(chunk_logits=16 * 64)  # 16 tokens per chunk at most: 3 chunks of 16
    outputs.math = math_watched
    outputs(hidden, output, targets, 0.0).loss.backward()
    assert alive_at_next == [False, False]
    alive_at_next.clear(), previous.clear()
    monkeypatch.setattr(loss_mod, "chunk_loss", chunk_loss_watched)
    with torch.no_grad():
        outputs(hidden, output, targets, 0.0)
    assert alive_at_next == [False, False]
