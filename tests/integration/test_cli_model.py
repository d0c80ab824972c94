"""`dlx params`, `export-hf`, `import-hf` as a user runs them: real subprocesses, exit codes, one-line errors."""

import json
import subprocess
import sys

import torch

from dlx.model import Transformer, resolve_model_args
from dlx.model.io import load_model, save_model


def dlx(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dlx", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_params_json_reports_the_seed_counts():
    result = dlx("params", "seed-165m", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert (payload["trainable"], payload["untrainable"], payload["total"]) == (164_897_280, 0, 164_897_280)


def test_params_table_prints_exact_integers():
    result = dlx("params", "llama3.2-1b")
    assert result.returncode == 0, result.stderr
    assert "1,235,814,400" in result.stdout


def test_bad_model_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("dim: 100\nn_heads: 3\n")
    for args in (["params", "no-such-preset"], ["params", str(bad)], ["params", str(tmp_path / "missing.json")]):
        result = dlx(*args)
        assert result.returncode == 2, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert "Traceback" not in result.stderr


def test_export_then_import_round_trip(tmp_path):
    torch.manual_seed(0)
    model = Transformer(resolve_model_args("debug", tie_embeddings=True)).eval()
    save_model(model, tmp_path / "ckpt")
    assert dlx("export-hf", str(tmp_path / "ckpt"), str(tmp_path / "hf")).returncode == 0
    assert (tmp_path / "hf" / "config.json").is_file()
    assert dlx("import-hf", str(tmp_path / "hf"), str(tmp_path / "back")).returncode == 0
    back = load_model(tmp_path / "back")
    tokens = torch.randint(0, 512, (1, 20))
    with torch.no_grad():
        assert torch.equal(back(tokens), model(tokens))
    again = dlx("import-hf", str(tmp_path / "hf"), str(tmp_path / "back"))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_import_of_a_non_model_folder_is_refused(tmp_path):
    result = dlx("import-hf", str(tmp_path), str(tmp_path / "out"))
    assert result.returncode == 2
    assert "config.json is missing" in result.stderr
    assert not (tmp_path / "out").exists()
