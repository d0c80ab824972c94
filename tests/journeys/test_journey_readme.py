"""J5: the README's quick start, run as it is written (bash, in an empty folder, with the environment's `dlx` first on
PATH): every command succeeds and leaves what the next one and the user read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.journey
README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start() -> str:
    section = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the quick start is one bash block"
    return blocks[0]


def test_the_readme_quick_start_runs_as_written(tmp_path):
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "200",
    }
    script = "set -euo pipefail\n" + quick_start()
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "runs/first/checkpoints/step-00000030/trainer_state.json").is_file()
    assert (tmp_path / "hf/first/config.json").is_file() and (tmp_path / "hf/first/tokenizer.json").is_file()
    assert "<html" in (tmp_path / "first.html").read_text()[:2000].lower()
    assert "dlx_stdlib_next_line" in result.stdout  # dlx eval's table
