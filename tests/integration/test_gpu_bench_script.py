"""benchmarks/gpu/run_gpu_bench.py and offline_deps.py on a CPU: the commands it would run (`python -m dlx`, no `dlx`
script needed), its git-free record, the wheel unpacking for a machine without network, the time budget, the
no-GPU refusal, and the entry it writes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu = load("run_gpu_bench")
deps = gpu.offline_deps


def test_check_dry_run_prints_python_m_dlx_commands(tmp_path, capsys):
    assert gpu.main(["--check", "--dry-run", "--out", str(tmp_path), "--wheels", str(tmp_path / "none")]) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = [line for line in lines if line.startswith(sys.executable)]
    assert len(commands) == 2
    for command in commands:
        assert command.startswith(f"{sys.executable} -m dlx bench --model llama3.2-1b --seq-len 2048 ")
        assert "--micro-batch 4,8,16 --precision bf16" in command
    assert "--grad-accum 1,4" in commands[0] and "--compile" not in commands[0]
    assert commands[1].endswith(f"--compile --out {tmp_path / 'llama3.2-1b-compile'}")
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_check_needs_an_output_folder(monkeypatch, capsys):
    monkeypatch.delenv("OUT", raising=False)
    assert gpu.main(["--check"]) == 2
    assert capsys.readouterr().err == "error: --check needs --out DIR or $OUT (the folder whose files come back)\n"


def test_check_refuses_a_machine_without_cuda_after_its_imports_pass(tmp_path, capsys):
    assert gpu.main(["--check", "--out", str(tmp_path), "--wheels", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("error: no CUDA device here")
    assert not (tmp_path / "entry.md").exists()


def test_the_record_needs_no_git(monkeypatch, tmp_path):
    from peers import record

    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the PATH
    monkeypatch.setenv("DLX_GIT_SHA", "abc1234")
    assert "- git: abc1234; python" in "\n".join(record.environment(["src/dlx"]))
    monkeypatch.delenv("DLX_GIT_SHA")
    assert "- git: unknown (no git; set DLX_GIT_SHA); python" in "\n".join(record.environment(["src/dlx"]))


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
    return wheel


def test_missing_distributions_are_unpacked_and_present_ones_kept(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "dlx_fake_dep", "1.0", {"dlx_fake_dep/__init__.py": "VALUE = 7\n"})
    make_wheel(wheels, "pluggy_extra", "2.0", {"pluggy_extra.data/purelib/pluggy_extra.py": "VALUE = 8\n"})
    make_wheel(wheels, "typing_extensions", "0.0.1", {"typing_extensions.py": "raise ImportError('shadowed')\n"})
    target = tmp_path / "deps"
    assert deps.unpack_missing(wheels, target) == [
        "dlx_fake_dep-1.0-py3-none-any.whl",
        "pluggy_extra-2.0-py3-none-any.whl",
    ]  # typing_extensions is installed here: kept
    probe = "import dlx_fake_dep, pluggy_extra, typing_extensions; print(dlx_fake_dep.VALUE + pluggy_extra.VALUE)"
    result = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(target)}, capture_output=True)
    assert result.stdout.strip() == b"15", result.stderr


def test_a_wheel_with_an_unsafe_path_is_refused(tmp_path):
    wheel = make_wheel(tmp_path, "evil", "1.0", {"../outside.py": "x = 1\n"})
    with pytest.raises(ValueError, match="unsafe path"):
        deps.extract_wheel(wheel, tmp_path / "deps")
    assert not (tmp_path / "outside.py").exists()


@pytest.mark.slow
def test_the_download_covers_what_dlx_bench_imports_and_nothing_else():
    """Run a one-point `dlx bench` and list the distributions of every module it imported: each of dlx's core
    dependencies among them must be downloaded, and none of the others."""
    probe = textwrap.dedent(
        """
        import importlib.metadata, json, runpy, sys, tempfile
        sys.argv = ["dlx", "bench", "--model", "debug", "--seq-len", "8", "--micro-batch", "1", "--precision",
                    "fp32", "--steps", "1", "--warmup", "0", "--out", tempfile.mkdtemp()]
        try:
            runpy.run_module("dlx", run_name="__main__")
        except SystemExit as stop:
            assert not stop.code, stop.code
        names = importlib.metadata.packages_distributions()
        print(json.dumps(sorted({d for m in list(sys.modules) for d in names.get(m.split(".")[0], [])})))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert result.returncode == 0, result.stderr
    imported = {deps.normalize(name) for name in json.loads(result.stdout.splitlines()[-1])}
    import tomllib

    def name(requirement: str) -> str:
        return deps.normalize(deps.requirement_name(requirement))

    all_core = {name(req) for req in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    core = {name(req) for req in deps.bench_requirements()}
    assert core == {deps.normalize(name) for name in deps.BENCH_DISTRIBUTIONS}
    assert imported & (all_core - {"torch"}) == core


def test_torchtitan_travels_as_its_wheel_and_the_four_dependencies_its_trainer_imports(tmp_path):
    requirements = deps.pinned(deps.peer_requirements())
    assert [deps.requirement_name(r) for r in requirements] == list(deps.PEER_DISTRIBUTIONS)
    _, alone = deps.download_commands(tmp_path, ["numpy==2.4.6", *requirements], "3.12")
    assert alone[alone.index("--no-deps") + 1 :] == requirements


def test_the_pip_download_lines_target_the_device_python(tmp_path):
    with_deps, alone = deps.download_commands(tmp_path, ["numpy==2.4.6", "tokenizers==0.23.3"], "3.12")
    assert with_deps[1:4] == ["-m", "pip", "download"]
    assert "--only-binary=:all:" in with_deps and with_deps[with_deps.index("--python-version") + 1] == "3.12"
    assert with_deps[-3:] == ["--dest", str(tmp_path), "numpy==2.4.6"]
    assert alone[-4:] == ["--dest", str(tmp_path), "--no-deps", "tokenizers==0.23.3"]


class SleepSweep(gpu.Sweep):
    """A sweep whose command sleeps (through a child process of its own) instead of benchmarking."""

    def command(self, out: Path) -> list[str]:
        seconds, pid_file = self.argv
        script = f"import subprocess, pathlib; p = subprocess.Popen(['sleep', '{seconds}']); "
        script += f"pathlib.Path('{pid_file}').write_text(str(p.pid)); p.wait()"
        return [sys.executable, "-c", script]


def test_sweeps_stop_at_the_time_budget_with_their_children(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "MIN_SWEEP_S", 1.0)
    pids = [tmp_path / f"{n}.pid" for n in range(3)]
    sweeps = [SleepSweep("quick", ("0.1", pids[0])), SleepSweep("long", ("60", pids[1]))]
    sweeps.append(SleepSweep("never", ("0.1", pids[2])))
    start = time.monotonic()
    with open(tmp_path / "run.log", "w") as log:
        statuses = gpu.run_sweeps(sweeps, tmp_path, gpu.child_env(None), budget_s=4.0, log=log)
    assert time.monotonic() - start < 30
    assert statuses[:2] == ["ok", "stopped at the time budget"]
    assert statuses[2].startswith("not started:") and not pids[2].exists()
    sleeper = int(pids[1].read_text())
    assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE


def test_the_entry_has_the_summary_against_the_target_and_the_fixed_costs(tmp_path):
    from dlx.bench.points import BenchPoint
    from dlx.bench.results import point_row, write_rows

    fixed = {"model": "llama3.2-1b", "device": "NVIDIA H200", "data": "synthetic", "compile": "off"}
    measured = {"it_per_s": 2.0, "tokens_per_s": 1.6e4, "step_s": 0.5, "forward_s": 0.15, "backward_s": 0.3}
    measured |= {"optimizer_s": 0.05, "peak_mem_gb": 40.0, "est_mem_gb": 38.7, "tflops": 500.0, "tflops_dense": 450.0}
    measured |= {"peak_tflops": 989.4, "peak_source": "datasheet"}
    rows = [
        point_row(fixed, BenchPoint(2048, 4, 1, "bf16"), "ok", mfu=0.51, mfu_dense=0.46, **measured),
        point_row(fixed, BenchPoint(2048, 4, 4, "bf16"), "ok", mfu=0.56, mfu_dense=0.5, **measured),
    ]
    rows[0] |= {"optimizer_pct": 9.0, "weight_cast_pct": 2.0}
    rows[1] |= {"optimizer_pct": 2.5, "weight_cast_pct": 2.0}
    (tmp_path / "llama3.2-1b").mkdir()
    write_rows(tmp_path / "llama3.2-1b" / "bench.csv", rows)
    sweeps = gpu.check_sweeps(5, 2)
    lines = gpu.entry_lines(sweeps, ["ok", "not started: 10 s of the budget left"], tmp_path, ["- head"], "test")
    text = "\n".join(lines)
    assert lines[0].startswith("### ") and lines[0].endswith(" — test")
    assert "- `dlx bench --model llama3.2-1b --seq-len 2048" in text and ": not started: 10 s" in text
    assert (
        "- llama3.2-1b, compile off: best MFU 56.0% (dense 50.0%) at seq 2048, micro-batch 4, grad accum 4 "
        "(target ≥ 55%: met)"
    ) in lines
    fixed_costs = "micro-batch 4: 11.0 % at grad accum 1, 4.5 % at grad accum 4"
    assert f"  - fixed costs (optimizer + autocast weight casts), {fixed_costs}" in lines
    assert "| 11.0 (9.0 + 2.0) |" in text


def test_record_appends_the_fetched_entry(tmp_path, capsys):
    benchmarks = tmp_path / "BENCHMARKS.md"
    benchmarks.write_text("# Benchmarks\n\n## GPU\n\nintro\n")
    assert gpu.record(tmp_path / "missing", benchmarks) == 2
    (tmp_path / "entry.md").write_text("### 2026-12-03 — lent device\n\n| a |\n")
    assert gpu.record(tmp_path, benchmarks) == 0
    assert benchmarks.read_text() == "# Benchmarks\n\n## GPU\n\nintro\n\n### 2026-12-03 — lent device\n\n| a |\n"


def test_a_given_sha_wins_over_the_git_of_the_copy(monkeypatch):
    """A device machine's tree can carry a .git of an older commit: the SHA the caller names is the one recorded."""
    from peers import record

    monkeypatch.setenv("DLX_GIT_SHA", "2af69bfb7fb3512e3b74f76900d6a0cd1b23cf80")
    assert "- git: 2af69bf; python" in "\n".join(record.environment(["src/dlx"]))


def test_first_contact_fits_one_device_call_and_names_its_steps():
    """Its steps' time limits add up to at most one device call (600 s); `--only` of no step is refused."""
    script = str(ROOT / "benchmarks" / "gpu" / "first_contact.py")
    listed = subprocess.run([sys.executable, script, "--dry-run"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    names = [line.split(" (≤ ")[0] for line in lines]
    assert names == ["check", "mfu-large", "prepare", "docmask-on", "docmask-off", "pretrain", "resume", "generate"]
    assert sum(int(line.split(" (≤ ")[1].split(" s)")[0]) for line in lines) <= 600
    assert "--document-mask" in lines[3] and "--resume" in lines[6]
    refused = subprocess.run([sys.executable, script, "--only", "nothing"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.startswith("error: --only names no step")


next_contact = load("next_contact")


def test_next_contact_fits_one_device_call():
    """Its steps' limits add up to at most 9.5 minutes; each pretrain step logs Dynamo's graph breaks and recompiles."""
    work = Path("WORK")
    listed = next_contact.steps(work, dry=False)
    assert [name for name, _, _ in listed] == [
        *("ceilings", "pretrain-bf16", "bare", "pretrain-float8", "hf-compiled", "seed-dlx", "seed-hf", "plan"),
        "torchtitan",
    ]
    assert sum(seconds for _, _, seconds in listed) <= 570
    later = [(name, seconds) for name, _, seconds in next_contact.steps(work, dry=False, later=True)[len(listed) :]]
    call = {row.step: row.call for row in next_contact.ROWS}
    second, third = ([(name, s) for name, s in later if call[name] == n] for n in (2, 3))
    assert [name for name, _ in second] == ["cp-path", "tune", "stages"]  # `--only cp-path,tune,stages`: 2nd call
    assert [name for name, _ in third] == ["first-step", "async-save"]  # `--only first-step,async-save`: the third
    assert sum(seconds for _, seconds in second) <= 570 and sum(seconds for _, seconds in third) <= 570
    argv = dict((name, argv) for name, argv, _ in listed)
    assert argv["torchtitan"][1].endswith("benchmarks/peers/side_by_side.py") and argv["torchtitan"][2] == "llama3.2-1b"
    assert argv["torchtitan"][-2:] == ["--out", str(work / "torchtitan.json")]
    assert "--train.compile true" in " ".join(argv["pretrain-bf16"]) and "llama3.2-1b" in argv["pretrain-bf16"]
    assert argv["pretrain-float8"][-2:] == ["--train.float8", "true"]
    assert "--parallel.activation_checkpointing full" in " ".join(argv["seed-dlx"])
    assert next_contact.TORCH_LOGS == "graph_breaks,recompiles"


def test_next_contact_judges_each_target_from_the_figures():
    pretrain = {"mfu_windows": [0.30, 0.58, 0.62], "tokens_per_s": 100.0, "loss": 5.0, "graph_breaks": 0}
    pretrain["attention"] = "attention: cudnn, the fastest fwd+bwd at ..."
    results = {
        "pretrain-bf16": {"figures": {**pretrain, "recompiles": 1}},
        "bare": {"figures": {"tokens_per_s": 101.0}},
        "pretrain-float8": {"figures": {"tokens_per_s": 112.0, "loss": 5.05}},
        "hf-compiled": {"figures": {"tokens_per_s": 80.0}},
        "seed-dlx": {"figures": {"peak_mem_gb": 30.0, "it_per_s": 0.5}},
        "seed-hf": {"figures": {"peak_mem_gb": 40.0, "it_per_s": 0.25}},
        "plan": {"figures": {"total_gb": 27.0}},
        "torchtitan": {"figures": {"dlx_over_titan": 1.04}},
    }
    rows = {row[0]: row[1:] for row in next_contact.target_rows(results)}
    titan = "dlx ÷ torchtitan, tokens/s (llama3.2-1b bf16 compiled, seq 2048, micro-batch 24)"
    assert rows[titan] == ("1.040", "≥ 1.05", "MISSED")
    results |= {"cp-path": {"figures": {"cp_over_plain": 0.975}}, "tune": {"figures": {"mfu": 0.58, "seconds": 420}}}
    results["stages"] = {"figures": {"extra_steps": 0.4}}
    rows = {row[0]: row[1:] for row in next_contact.target_rows(results)}
    cp = "context-parallel path at degree 1 ÷ plain path, tokens/s (llama3.2-1b bf16 compiled, 16,384 tokens)"
    assert rows[cp] == ("0.975", "≥ 0.97", "met")
    assert rows["dlx tune recipes/llama3.2-1b.yaml: the winner's MFU, unattended"] == (
        "58.0% in 420 s",
        "≥ 57.6% MFU in ≤ 600 s",
        "met",
    )
    stages = "stage boundary (seq_len 2,048 → 4,096, RoPE): the crossing step's extra time, in normal steps (1B bf16)"
    assert rows[stages] == ("0.40", "< 1 step", "met")
    cases = {case: {"to_first_step_s": s, "header": f"compile: {case}"} for case, s in (("cold", 95.0), ("warm", 31.0))}
    results |= {"first-step": {"figures": {"first_step": {**cases, "resumed": {"to_first_step_s": 33.0}}}}}
    results |= {"async-save": {"figures": {"async": {"next_step_slowdown": 0.3, "later_next_step_slowdown": 0.04}}}}
    rows = {row[0]: row[1:] for row in next_contact.target_rows(results)}
    first = "launch → first logged step, s: cold / warm / resumed (llama3.2-1b bf16 compiled, seq 2048, micro 8)"
    assert rows[first] == ("95.0 / 31.0 / 33.0", "warm < cold", "met")
    saved = "checkpoint.async: the step after a later save ÷ a steady step − 1 (llama3.2-1b bf16, fsdp on 1 GPU)"
    assert rows[saved] == ("+4.0%", "≤ +10 %", "met")  # the later save: the first also starts the writer process
    assert rows["dlx pretrain MFU, lowest 10-step window after the first"] == ("58.0%", "≥ 60 %", "MISSED")
    assert rows["graph breaks / recompiles logged"] == ("0 / 1", "0 / 0 after step 1", "MISSED")
    assert rows["dlx ÷ bare loop, tokens/s"] == ("0.990", "≥ 0.98", "met")
    assert rows["dlx ÷ HF compiled, tokens/s"] == ("1.250", "≥ 1.15", "met")
    assert rows["float8 ÷ bf16, tokens/s"] == ("1.120", "≥ 1.10", "met")
    assert rows["float8 loss vs bf16 at the last step"] == ("1.00%", "within 2 %", "met")
    assert rows["seed row peak GB, dlx / HF Trainer"] == ("30.00 / 40.00", "dlx below HF", "met")
    assert rows["dlx plan vs dlx's measured peak"] == ("10.0%", "within 15 %", "met")
    empty = next_contact.target_rows({})
    assert all(row[3] in ("not measured", "") for row in empty)
    ceilings = {"matmul_side": 8192, "matmul_tflops": 800.0, "attention": "attention: flash, ...", "gemms": []}
    ceilings |= {"adamw_floor_s": 0.05, "adamw_params": 1_235_814_400}
    ceilings["loss_accumulation"] = {"chunks": 8, "fused_ms": 30.0, "separate_ms": 100.0, "relative_difference": 0.003}
    ceilings["loss_accumulation"]["one_gemm"] = True
    bf16 = {"status": "ok", "seconds": 100.0, "figures": pretrain}
    lines = next_contact.table(
        {"ceilings": {"status": "ok", "seconds": 40.0, "figures": ceilings}, "pretrain-bf16": bf16}
    )
    assert (
        "- the loss's output-weight gradient over 8 chunks: one GEMM into fp32 30.0 ms, product then add 100.0 ms; "
        "they differ by 0.003 of the largest element (bf16 rounding ≤ 2⁻⁸)"
    ) in lines
    assert "| ceilings | ok | 40 |" in lines
    assert "- dlx pretrain bf16, its header: attention: cudnn, the fastest fwd+bwd at ..." in lines
    contenders = {"dlx": {"tokens_per_s": 70000.0, "peak_mem_gb": 84.8}}
    contenders["torchtitan"] = {"tokens_per_s": 65000.0, "peak_mem_gb": 90.1, "first_loss": 11.9}
    titan = {"dlx_over_titan": 70 / 65, "dlx_first_loss": 11.91, "contenders": contenders}
    lines = next_contact.table({"torchtitan": {"status": "ok", "seconds": 90.0, "figures": titan}})
    assert (
        "- dlx against torchtitan: dlx 70,000 tokens/s, peak 84.8 GB; torchtitan 65,000 tokens/s, peak 90.1 GB; "
        "first losses dlx 11.91000, torchtitan 11.90000"
    ) in lines
    measure = "dlx ÷ torchtitan, tokens/s (llama3.2-1b bf16 compiled, seq 2048, micro-batch 24)"
    assert f"| {measure} | 1.077 | ≥ 1.05 | met |" in lines


@pytest.mark.slow
@pytest.mark.timeout(900)  # nine steps, each a fresh Python with torch: minutes on a CPU shared with other work
def test_next_contact_dry_run_measures_every_step_on_the_cpu(tmp_path):
    """The whole script on the CPU with the debug model: every step runs, float8 too (torchao is in the test extra,
    and torch's CPU float8 matmul runs it), and the files come back."""
    script = str(ROOT / "benchmarks" / "gpu" / "next_contact.py")
    done = subprocess.run(
        [sys.executable, script, "--dry-run", "--out", str(tmp_path)], capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    statuses = {name: step["status"] for name, step in results.items()}
    titan = statuses.pop("torchtitan")
    second = (statuses.pop("cp-path"), statuses.pop("tune"), statuses.pop("stages"))
    assert second == ("ok", "ok", "ok")  # the second call's rows, dry
    assert results["stages"]["figures"]["crossing_s"] > 0
    assert results["cp-path"]["figures"]["cp_over_plain"] > 0 and results["tune"]["figures"]["measured"]
    assert (statuses.pop("first-step"), statuses.pop("async-save")) == ("ok", "ok")  # the third call's, dry
    first = results["first-step"]["figures"]
    assert sorted(first["first_step"]) == ["cold", "resumed", "warm"]  # dry: no compile, no eager reference
    assert results["async-save"]["figures"]["async"]["blocking_s"] >= 0
    assert statuses == dict.fromkeys(
        ("ceilings", "pretrain-bf16", "bare", "pretrain-float8", "hf-compiled", "seed-dlx", "seed-hf", "plan"), "ok"
    )
    if importlib.util.find_spec("torchtitan") is None:  # the bench extra's: the step fails in one line, the rest run
        assert titan == "exit 1" and "torchtitan" in results["torchtitan"]["last_line"]
    else:  # first losses checked equal (else exit 1), then both timed
        assert titan == "ok" and results["torchtitan"]["figures"]["dlx_over_titan"] > 0
    assert results["pretrain-bf16"]["figures"]["step"] == 3 and results["plan"]["figures"]["params"] == 158016
    bf16_loss, float8_loss = (results[f"pretrain-{run}"]["figures"]["loss"] for run in ("bf16", "float8"))
    assert results["pretrain-float8"]["figures"]["step"] == 3 and abs(float8_loss / bf16_loss - 1) <= 0.02
    table = (tmp_path / "table.md").read_text()
    assert "- attention: CPU, no other kernel to choose from; SDPA runs scaled_dot_product_flash_attention" in table
    assert "- dlx pretrain bf16, its header: attention: CPU, no other kernel to choose from; SDPA runs " in table
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "metrics-bf16.jsonl",
        "metrics-float8.jsonl",
        "results.json",
        "steps.log",
        "summary.txt",
        "table.md",
    ]
