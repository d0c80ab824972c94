"""benchmarks/peers/titan.py: torchtitan's own Trainer, configured by the harness at dlx's debug shape, starts from
dlx's initial weights and trains as dlx does (the same synthetic batches, AdamW, clipping): the first losses agree to
fp32 rounding and the losses after three steps of each trainer to 1e-4 (dlx leaves norms and biases out of weight
decay, torchtitan decays every weight: 3 steps × lr 3e-4 × 0.1 move them by about 1e-7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchtitan", reason="the bench extra's torchtitan")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers.contenders import Dlx  # noqa: E402
from peers.side_by_side import dlx_first_loss  # noqa: E402
from peers.titan import Setting, Titan, synthetic_loader  # noqa: E402

SETTING = Setting(("--model.preset", "debug"), 32, 2, "fp32", False)


def test_torchtitan_starts_from_dlx_weights_and_trains_as_dlx(tmp_path):
    dlx_start = dlx_first_loss(SETTING, torch.device("cpu"))
    titan = Titan(SETTING, tmp_path / "titan")
    try:
        assert titan.stood_in[-1].startswith('device_type "cuda" -> "cpu"')
        assert abs(titan.first_loss(2) - dlx_start) <= 1e-5
        titan.run(3)
        titan_after = titan.first_loss(2)
    finally:
        titan.close()
    dlx = Dlx("fp32", tmp_path / "dlx", argv=SETTING.dlx_argv())
    try:
        dlx.run(3)
        inputs, targets = next(synthetic_loader(SETTING, 512))[:2]
        with torch.no_grad():
            dlx_after = dlx.session.strategy.model(inputs[:2], targets=targets[:2]).loss.item()
    finally:
        dlx.close()
    assert dlx_after < dlx_start - 0.05  # both trained
    assert abs(titan_after - dlx_after) <= 1e-4


def test_without_hf_datasets_torchtitan_imports_and_the_stand_in_refuses_in_one_line():
    """The device machine's case (no Hugging Face Datasets, no TensorBoard): torchtitan's trainer imports, and a call
    into what was stood in for names what is missing."""
    probe = (
        "import sys; sys.path.insert(0, 'benchmarks'); sys.modules['datasets'] = sys.modules['tensorboard'] = None\n"
        "from peers.titan_setup import prepare_imports; done = prepare_imports()\n"
        "import torchtitan.trainer, datasets\n"
        "assert 'datasets (Hugging Face Datasets loader)' in done, done\n"
        "datasets.load_dataset('c4')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "RuntimeError: datasets.load_dataset is not installed here (Hugging Face Datasets, for torchtitan's text "
        "datasets); the torchtitan harness does not use it"
    )
