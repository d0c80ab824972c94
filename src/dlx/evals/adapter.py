"""`DlxLM`: dlx's model as an lm-evaluation-harness model (`lm_eval.api.model.LM`), so that lm-eval's tasks and
metrics run on it, live inside a training run or on a checkpoint (`dlx eval`).

Requests are turned into tokens as lm-eval's own `--model hf` (HFLM) does, so the two agree request for request on
the same weights: trailing whitespace of a context moves to the continuation, the pair is encoded whole and split at
the context's length, an empty context is the prefix token (bos, else eos), and a sequence longer than the model's
window keeps its last `max_seq_len + 1` tokens. `loglikelihood_rolling` cuts a text into lm-eval's rolling windows;
`generate_until` runs dlx's generation (KV cache, greedy unless the task samples; under tensor parallelism one forward
over the whole sequence per token) and cuts at the stop strings.

Under torchrun every rank runs the model forward the same number of times (FSDP, ZeRO-3 and tensor parallelism need
every rank in each forward); the data-parallel ranks split the log-likelihood requests between them and exchange the
results, so every rank returns them all and lm-eval computes the same metrics on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import LM

from dlx.data.prepare.tokenizer import document_token_ids
from dlx.model.generate import run_eagerly
from dlx.model.kv_cache import KVCache
from dlx.parallel.distributed import DistEnv

BATCH_TOKENS = 8192
"""Padded tokens per forward at most (rows × the longest row): the logits of one batch are this × the vocabulary."""


@dataclass(frozen=True)
class Row:
    """One request as the model sees it: HFLM's input (context + continuation)[-(max_seq_len + 1):][:-1], split where
    the scored positions start. The logits at `scored`'s positions predict `targets`, the continuation's tokens."""

    index: int
    before: list[int]
    scored: list[int]
    targets: list[int]

    @classmethod
    def of(cls, index: int, context: list[int], continuation: list[int], max_length: int) -> Row:
        row = (context + continuation)[-(max_length + 1) :][:-1]
        n = min(len(continuation), len(row))
        return cls(index, row[: len(row) - n], row[len(row) - n :], continuation[len(continuation) - n :])

    @property
    def width(self) -> int:
        return len(self.before) + len(self.scored)


@dataclass(frozen=True)
class Scored:
    """One request's result, as lm-eval takes it."""

    logprob: float
    greedy: bool


class DlxLM(LM):
    """lm-eval's model interface over a dlx Transformer (bare, or sharded by FSDP / tensor parallelism)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        max_seq_len: int,
        prefix_token_id: int,
        eos_id: int,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
        env: DistEnv | None = None,
        batch_tokens: int = BATCH_TOKENS,
    ) -> None:
        """`tokenizer`: a `tokenizers.Tokenizer`; `autocast`: the run's precision context; `env`: this rank's place."""
        super().__init__()
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_seq_len
        self.prefix_token_id, self.eos_id, self.autocast = prefix_token_id, eos_id, autocast
        self.env = env or DistEnv()
        self.batch_tokens = batch_tokens
        self.forwards = 0
        """Forward passes run by this adapter (the tests count them)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tok_encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids  # special tokens as the tokenizer adds them, as HFLM encodes

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation tokens as HFLM splits them (lm_eval.api.model.TemplateLM._encode_pair)."""
        if context == "":
            return [self.prefix_token_id], self.tokenizer.encode(continuation, add_special_tokens=False).ids
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, context_ids = self.tok_encode(context + continuation), self.tok_encode(context)
        return context_ids, whole[len(context_ids) :]

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self.encode_pair(*request.args) for request in requests]
        return [(s.logprob, s.greedy) for s in self.score(pairs)]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows, owners = [], []
        for index, request in enumerate(requests):
            rolling = lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(request.args[0]),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for window in map(lm_utils.make_disjoint_window, rolling):
                windows.append(window)
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, scored in zip(owners, self.score(windows), strict=True):
            totals[owner] += scored.logprob
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Every rank generates every request (generation is a few sequential forwards; FSDP needs all ranks)."""
        was_training = self.model.training
        try:
            with run_eagerly():
                return [self.generate_one(*request.args) for request in requests]
        finally:
            self.model.train(was_training)

    def generate_one(self, context: str, gen_kwargs: dict[str, Any]) -> str:
        until = gen_kwargs.get("until") or [self.tokenizer.decode([self.eos_id])]
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(gen_kwargs.get("max_gen_toks", 256))
        temperature = float(gen_kwargs.get("temperature", 0.0)) if gen_kwargs.get("do_sample") else 0.0
        ids = self.tok_encode(context)[-max(1, self.max_length - max_new) :]
        self.model.eval()
        if self.env.tp > 1:
            new = self.generate_whole_rows(ids, max_new, temperature)
        else:  # generated in the weights' dtype, as `dlx generate` runs
            prompt = torch.tensor([ids], device=self.device)
            out = self.model.generate(prompt, max_new, temperature=temperature, eos_id=self.eos_id)
            self.forwards += out.shape[1] - prompt.shape[1]
            new = out[0, prompt.shape[1] :].tolist()
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        for stop in until:
            if stop:
                text = text.split(stop)[0]
        return text

    @torch.no_grad()
    def generate_whole_rows(self, ids: list[int], max_new: int, temperature: float) -> list[int]:
        """The tokens generated after `ids` under tensor parallelism, which has no KV cache (each rank's attention
        holds a slice of the heads, and the sequence is split over the ranks between blocks): each token is one
        forward over the whole sequence so far, right-padded to a multiple of tp (causal attention: padding after the
        last token changes nothing before it), in the weights' dtype as the cached path. The logits are gathered
        from their vocabulary shards, so every rank picks the same token and runs the same next forward; sampling
        draws from a generator seeded alike on every rank."""
        from dlx.model.generate import sample_next

        tokens, total = list(ids), min(len(ids) + max_new, self.max_length)
        generator = torch.Generator(self.device).manual_seed(0) if temperature > 0 else None
        while len(tokens) < total:
            logits = self.model(self.padded([tokens], len(tokens) + (-len(tokens) % self.env.tp)))  # (1, T, vocab)
            self.forwards += 1
            if hasattr(logits, "full_tensor"):
                logits = logits.full_tensor()
            tokens.append(int(sample_next(logits[:, len(tokens) - 1], temperature, generator=generator)[0]))
            if tokens[-1] == self.eos_id:
                break
        return tokens[len(ids) :]

    def score(self, pairs: list[tuple[list[int], list[int]]]) -> list[Scored]:
        """Σ log p(continuation | context) and whether greedy decoding gives the continuation, per pair. This rank
        scores its share of the units (`units`); every rank gets every result."""
        units = self.units([Row.of(i, *pair, self.max_length) for i, pair in enumerate(pairs)])
        mine = units[self.env.dp_rank :: self.env.dp_size]
        count = self.agree_on_units(len(mine))
        results: dict[int, Scored] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            with run_eagerly():  # every request its own shapes: the blocks' eager code, compiled or not
                for index in range(count):
                    if index < len(mine):
                        results.update(self.score_unit(mine[index]))
                    else:  # a rank with fewer units joins the forwards the others run (FSDP gathers in each)
                        self.score_unit([Row(-1, [self.prefix_token_id], [self.eos_id], [self.eos_id])])
        finally:
            self.model.train(was_training)
        return self.exchange(len(pairs), results)

    @property
    def shares_contexts(self) -> bool:
        """On a CPU (compute-bound at any batch size), requests with one context run it once into a KV cache."""
        return self.device.type == "cpu" and self.env.tp == 1

    def units(self, rows: list[Row]) -> list[list[Row]]:
        """Work units, longest rows first. Sharing contexts: the rows of one context (a multiple-choice question's
        answers: 2.5x fewer tokens on dlx_stdlib_next_line). Else (a GPU, where small batches leave it idle; tensor
        parallelism, which has no KV cache): batches of whole rows, rows × the longest within batch_tokens."""
        rows = sorted(rows, key=lambda row: -row.width)
        if self.shares_contexts:
            by_context: dict[tuple[int, ...], list[Row]] = {}
            for row in rows:
                by_context.setdefault(tuple(row.before), []).append(row)
            return list(by_context.values())
        units: list[list[Row]] = []
        for row in rows:
            if units and (len(units[-1]) + 1) * units[-1][0].width <= self.batch_tokens:
                units[-1].append(row)
            else:
                units.append([row])
        return units

    def agree_on_units(self, count: int) -> int:
        """The most units any rank has: every rank runs that many."""
        if not self.env.is_distributed:
            return count
        from dlx.parallel.distributed import all_reduce

        return int(all_reduce([float(count)], "max", self.device)[0])

    @torch.no_grad()
    def score_unit(self, unit: list[Row]) -> dict[int, Scored]:
        """Each row's scored logits, (len(scored), vocab), from one unit's forwards."""
        logits, offset = self.shared_context_logits(unit) if self.shares_contexts else self.whole_row_logits(unit)
        scored = {}
        for i, row in enumerate(unit):
            start = offset(row)
            picked = F.log_softmax(logits[i, start : start + len(row.scored)].float(), dim=-1)  # (n, vocab)
            target = torch.tensor(row.targets, device=picked.device)
            logprob = picked.gather(1, target[:, None]).sum().item()
            scored[row.index] = Scored(logprob, bool((picked.argmax(-1) == target).all()))
        return scored

    def whole_row_logits(self, unit: list[Row]) -> tuple[torch.Tensor, Callable[[Row], int]]:
        """One forward over the whole rows, right-padded (causal attention: padding after a row changes nothing)."""
        width = unit[0].width + (-unit[0].width % self.env.tp)  # sequence parallelism: positions split over tp
        logits = self.forward(self.padded([row.before + row.scored for row in unit], width))  # (B, T, vocab)
        if hasattr(logits, "full_tensor"):  # tensor parallelism: the vocabulary is sharded over the ranks
            logits = logits.full_tensor()
        return logits, lambda row: len(row.before)

    def shared_context_logits(self, unit: list[Row]) -> tuple[torch.Tensor, Callable[[Row], int]]:
        """The context (`before`, the same for every row) once into a KV cache, then the scored parts of all rows
        from there: the same positions and attention as whole rows, fewer tokens."""
        before, width = unit[0].before, max(len(row.scored) for row in unit)
        shared = self.caches(1, len(before) + 1)
        self.forward(self.padded([before or [self.prefix_token_id]], len(before) or 1), shared)
        caches = self.caches(len(unit), len(before) + width)
        for cache, one in zip(caches, shared, strict=True):
            cache.keys[:, : len(before)] = one.keys[:, : len(before)]
            cache.values[:, : len(before)] = one.values[:, : len(before)]
        logits = self.forward(self.padded([row.scored for row in unit], width), caches, len(before))
        return logits, lambda row: 0

    def caches(self, batch: int, length: int) -> list[KVCache]:
        """One KV cache per layer, in the dtype attention computes in (autocast's, else the weights')."""
        args = self.model.args
        with self.autocast():
            on = torch.is_autocast_enabled(self.device.type)
            dtype = torch.get_autocast_dtype(self.device.type) if on else next(self.model.parameters()).dtype
        return [KVCache(batch, length, args.kv_heads, args.head_dim, dtype, self.device) for _ in range(args.n_layers)]

    def padded(self, rows: list[list[int]], width: int) -> torch.Tensor:
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = torch.tensor(row)
        return tokens.to(self.device)

    def forward(self, tokens: torch.Tensor, caches: list[KVCache] | None = None, start: int = 0) -> torch.Tensor:
        with self.autocast():
            logits = self.model(tokens, caches, start_pos=start) if caches is not None else self.model(tokens)
        self.forwards += 1
        return logits

    def exchange(self, total: int, mine: dict[int, Scored]) -> list[Scored]:
        """Every data-parallel rank's results, in request order, on every rank."""
        if self.env.dp_size == 1:
            return [mine[i] for i in range(total)]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(gathered, mine)
        merged: dict[int, Scored] = {}
        for part in gathered:
            merged.update(part)  # the tensor-parallel ranks of one replica hold the same results
        return [merged[i] for i in range(total)]


def build_adapter(
    model: torch.nn.Module,
    tokenizer_file: Path,
    autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    env: DistEnv | None = None,
) -> DlxLM:
    """The adapter over a dlx model with its tokenizer.json; the prefix token of an empty context is the tokenizer's
    begin-of-document token, else its end-of-document token (as HFLM picks them from the exported config)."""
    from tokenizers import Tokenizer

    eos_id, bos_id = document_token_ids(tokenizer_file)
    prefix = bos_id if bos_id is not None else eos_id
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return DlxLM(model, tokenizer, model.args.max_seq_len, prefix, eos_id, autocast, env)
