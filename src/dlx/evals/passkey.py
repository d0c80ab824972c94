"""Passkey retrieval: a number hidden in filler text at several depths and lengths; can the model say it back?

Each prompt is exactly `length` tokens of the model's tokenizer: repeated filler sentences with the needle ("The pass
key is 71432. Remember it. 71432 is the pass key.") at the sentence boundary nearest `depth` (0: the start, 1: just
before the question), then the question "What is the pass key? The pass key is". The answer is " 71432" in the same
tokenizer. Scored teacher-forced in one forward pass: retrieved when the model's argmax at every answer position is
the answer's next token, which is exactly when greedy decoding would produce the answer; also the answer's mean
log-likelihood per token. Accuracy per (length, depth) over `samples` keys drawn from `seed`. The prompt is
data-free (no dataset needed), as in Mohtashami & Jaggi (2023) and the long-context evaluations that followed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dlx.errors import UserError

FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = " What is the pass key? The pass key is"
"""Each piece starts with its space, so that the concatenated token lists read as the text would be encoded."""


@dataclass(frozen=True)
class PasskeyPrompt:
    tokens: list[int]
    """The whole prompt, exactly the requested length."""
    answer: list[int]
    """The answer's tokens (" 71432"), which follow the prompt."""
    needle_at: int
    """Token position where the needle starts."""


@dataclass(frozen=True)
class PasskeyScore:
    length: int
    depth: float
    samples: int
    retrieved: int
    mean_logprob: float
    """Mean log-likelihood per answer token (nats), over the samples."""

    @property
    def accuracy(self) -> float:
        return self.retrieved / self.samples


def build_prompt(tokenizer, length: int, depth: float, key: int) -> PasskeyPrompt:
    """`length` tokens of filler with the needle at `depth` of it and the question at the end."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    needle = encode(f" The pass key is {key}. Remember it. {key} is the pass key.")
    question, sentence = encode(QUESTION), encode(FILLER)
    room = length - len(needle) - len(question)
    if room < 0:
        raise UserError(
            f"--lengths {length} is too short for the needle and the question; give {length - room} or more"
        )
    filler = (sentence * (room // len(sentence) + 1))[-room:] if room else []  # a partial sentence first
    boundaries = [0, *range(room % len(sentence), room + 1, len(sentence))]
    cut = min(boundaries, key=lambda b: abs(b - depth * room))  # the sentence boundary nearest `depth`
    return PasskeyPrompt(filler[:cut] + needle + filler[cut:] + question, encode(f" {key}"), cut)


@torch.no_grad()
def score_prompt(model, prompt: PasskeyPrompt) -> tuple[bool, float]:
    """(retrieved by greedy decoding, mean answer log-likelihood per token) from one teacher-forced forward pass."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt.tokens + prompt.answer[:-1]], device=device)
    logits = model(ids)[0, len(prompt.tokens) - 1 :].float()  # (answer tokens, vocab)
    answer = torch.tensor(prompt.answer, device=device)
    logprobs = logits.log_softmax(-1).gather(-1, answer[:, None]).squeeze(-1)
    return bool((logits.argmax(-1) == answer).all()), float(logprobs.mean())


def evaluate_passkey(
    model, tokenizer, lengths: Sequence[int], depths: Sequence[float], samples: int, seed: int = 0
) -> list[PasskeyScore]:
    """A score per (length, depth), keys of five digits drawn from `seed` (the same keys at every cell)."""
    max_len = model.args.max_seq_len
    too_long = [n for n in lengths if n + 8 > max_len]
    if too_long:
        raise UserError(
            f"--lengths {too_long[0]} does not fit the model's max_seq_len {max_len} with the answer; give lengths "
            f"up to {max_len - 8} (or train with a larger model.max_seq_len)"
        )
    bad_depth = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad_depth:
        raise UserError(f"--depths {bad_depth[0]}: a depth is a fraction of the context, from 0 (start) to 1 (end)")
    keys = [random.Random(f"{seed}-{i}").randrange(10_000, 100_000) for i in range(samples)]
    model.eval()
    scores = []
    for length in lengths:
        for depth in depths:
            results = [score_prompt(model, build_prompt(tokenizer, length, depth, key)) for key in keys]
            retrieved = sum(ok for ok, _ in results)
            mean = sum(lp for _, lp in results) / len(results)
            scores.append(PasskeyScore(length, depth, samples, retrieved, mean))
    return scores


def score_table(scores: Sequence[PasskeyScore]) -> list[str]:
    """Accuracy by length (rows) and depth (columns), then the mean answer log-likelihood the same way."""
    lengths = sorted({s.length for s in scores})
    depths = sorted({s.depth for s in scores})
    by_cell = {(s.length, s.depth): s for s in scores}
    head = "| length \\ depth | " + " | ".join(f"{d:g}" for d in depths) + " |"
    rule = "|---|" + "---|" * len(depths)
    lines = ["passkey retrieval accuracy (greedy):", head, rule]
    for n in lengths:
        cells = [f"{by_cell[n, d].accuracy:.2f}" for d in depths]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "mean log-likelihood per answer token (nats):", head, rule]
    for n in lengths:
        lines.append(f"| {n} | " + " | ".join(f"{by_cell[n, d].mean_logprob:.3f}" for d in depths) + " |")
    return lines


def default_lengths(max_seq_len: int) -> list[int]:
    """`dlx eval --tasks passkey`'s lengths: all of the model's context (less the answer), and a quarter and half of it
    when they are at least 256 tokens (shorter ones hardly hold the needle in filler)."""
    parts = [n for n in (max_seq_len // 4, max_seq_len // 2) if n >= 256]
    return sorted({*parts, max_seq_len - 8})


def passkey_results(scores: Sequence[PasskeyScore]) -> dict[str, dict[str, float]]:
    """The scores in lm-evaluation-harness's results shape: {"passkey_len{L}_depth{D}": {"acc,none": ...,
    "mean_logprob,none": ...}}, and "passkey" with the accuracy over every cell."""
    cells = {
        f"passkey_len{s.length}_depth{s.depth:g}": {"acc,none": s.accuracy, "mean_logprob,none": s.mean_logprob}
        for s in scores
    }
    overall = sum(s.accuracy * s.samples for s in scores) / sum(s.samples for s in scores)
    return {"passkey": {"acc,none": overall}, **cells}


def run_passkey(
    model: torch.nn.Module,
    tokenizer,
    lengths: Sequence[int] | None,
    depths: Sequence[float],
    samples: int,
    seed: int,
) -> list[PasskeyScore]:
    """Passkey scores of a loaded model (`dlx.train.rundir.trained.load_trained`) with its tokenizer; `lengths` None:
    `default_lengths` of the model's context."""
    lengths = default_lengths(model.args.max_seq_len) if lengths is None else lengths
    return evaluate_passkey(model, tokenizer, lengths, depths, samples, seed)
