"""Passkey retrieval: prompts of exactly the asked length with the needle at the asked depth; scores from one
teacher-forced pass (retrieved exactly when greedy decoding says the key); `dlx passkey` on a run; bad input."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer

from dlx.errors import UserError
from dlx.evals.passkey import build_prompt, evaluate_passkey, score_prompt
from dlx.train.launch import launch
from train_helpers import TINY, make_dataset, run_cli

pytestmark = pytest.mark.usefixtures("in_process_training")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("passkey") / "data", vocab_size=400)


@pytest.fixture(scope="module")
def tokenizer(dataset) -> Tokenizer:
    return Tokenizer.from_file(str(dataset / "tokenizer.json"))


class Scripted(torch.nn.Module):
    """Predicts, at each position, the token `script` names there (logit 5 on it, 0 elsewhere)."""

    def __init__(self, script: list[int], vocab: int):
        super().__init__()
        self.script, self.vocab = script, vocab
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.args = SimpleNamespace(max_seq_len=4096)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(1, tokens.shape[1], self.vocab)
        logits[0, torch.arange(tokens.shape[1]), torch.tensor(self.script[: tokens.shape[1]])] = 5.0
        return logits


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_a_prompt_is_the_length_asked_with_the_needle_at_its_depth(tokenizer, depth):
    prompt = build_prompt(tokenizer, 300, depth, 71432)
    assert len(prompt.tokens) == 300
    needle = tokenizer.encode(" The pass key is 71432. Remember it. 71432 is the pass key.").ids
    assert prompt.tokens[prompt.needle_at : prompt.needle_at + len(needle)] == needle
    question = tokenizer.encode(" What is the pass key? The pass key is").ids
    room = 300 - len(needle) - len(question)
    assert abs(prompt.needle_at - depth * room) <= len(tokenizer.encode(" The grass is green.").ids) * 5
    assert prompt.tokens[-len(question) :] == question
    assert tokenizer.decode(prompt.answer).strip() == "71432"
    if depth == 1.0:
        assert prompt.needle_at == room  # right before the question


def test_retrieved_exactly_when_greedy_decoding_says_the_key(tokenizer):
    prompt = build_prompt(tokenizer, 120, 0.5, 55555)
    vocab = tokenizer.get_vocab_size()
    right = Scripted(prompt.tokens[1:] + prompt.answer, vocab)
    retrieved, logprob = score_prompt(right, prompt)
    assert retrieved and logprob == pytest.approx(-math.log1p((vocab - 1) * math.exp(-5)), abs=1e-6)
    wrong = [*prompt.answer[:-1], (prompt.answer[-1] + 1) % vocab]
    retrieved, logprob = score_prompt(Scripted(prompt.tokens[1:] + wrong, vocab), prompt)
    assert not retrieved and logprob < -1.5


def test_bad_lengths_and_depths_are_one_line(tokenizer):
    model = Scripted([], 400)
    model.args.max_seq_len = 100
    with pytest.raises(UserError, match="--lengths 200 does not fit the model's max_seq_len 100"):
        evaluate_passkey(model, tokenizer, [200], [0.5], 1)
    with pytest.raises(UserError, match=r"--depths 1\.5: a depth is a fraction"):
        evaluate_passkey(model, tokenizer, [50], [1.5], 1)
    with pytest.raises(UserError, match="--lengths 10 is too short"):
        build_prompt(tokenizer, 10, 0.5, 12345)


def test_the_command_scores_a_run(dataset, tmp_path):
    run_dir = tmp_path / "run"
    args = [*TINY, "--data.path", str(dataset), "--data.num_workers", "0", "--train.max_steps", "1"]
    assert launch(None, args, run_dir, resume=False) == 0
    result = run_cli(["passkey", str(run_dir), "--lengths", "80,120", "--depths", "0,1", "--samples", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| length \\ depth | 0 | 1 |" in result.stdout and "| 120 |" in result.stdout
    result = run_cli(["passkey", str(run_dir), "--lengths", "1000"], tmp_path)
    assert result.returncode == 2 and "max_seq_len 128" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    scored = run_cli(["eval", str(run_dir), "--tasks", "passkey", "--limit", "2", "--json"], tmp_path)
    assert scored.returncode == 0, scored.stderr
    results = json.loads(scored.stdout)["results"]
    cells = {name for name in results if name.startswith("passkey_len")}
    assert cells == {f"passkey_len120_depth{d}" for d in ("0", "0.5", "1")}  # max_seq_len 128: the whole context
    assert results["passkey"]["acc,none"] == pytest.approx(sum(results[c]["acc,none"] for c in cells) / len(cells))
