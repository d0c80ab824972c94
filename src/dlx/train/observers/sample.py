"""`dlx generate`: a trained model and its run's tokenizer, from a run folder or one checkpoint folder; and the same
generation during training (`eval.sample_every`, `eval.sample_prompts`), an observer of the run (`SampleObserver`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dlx import device as dev
from dlx.data.prepare.tokenizer import document_bos_id, encode_prompt
from dlx.data.shards import TOKENIZER_FILE
from dlx.errors import UserError
from dlx.train.config import EvalSection
from dlx.train.observers.base import Observer
from dlx.train.rundir.trained import load_trained, resolve_trained, say_on_stderr

if TYPE_CHECKING:
    from dlx.metrics.logger import MetricsLogger
    from dlx.train.build.console import RunConsole


def sample_text(
    path: str | Path,
    prompt: str,
    max_new_tokens: int = 100,
    temperature: float = 0.8,
    top_k: int | None = 50,
    top_p: float | None = None,
    seed: int = 0,
    device: str = "auto",
) -> str:
    trained = load_trained(resolve_trained(path, "dlx generate", say_on_stderr), dev.resolve_device(device))
    bos_id = trained_bos_id(trained.source.tokenizer)
    return continue_text(
        trained.model, trained.tokenizer, prompt, max_new_tokens, temperature, top_k, top_p, seed, bos_id
    )


def trained_bos_id(tokenizer_file: Path) -> int | None:
    """The BOS id the run's documents started with: its dataset's manifest when the tokenizer.json is a run folder's
    copy and data.path (or the first data.mix source) is still there, else `document_bos_id`."""
    from dlx.data.shards import MANIFEST_FILE, read_manifest
    from dlx.train.rundir.folder import RUN_CONFIG_FILE, saved_config

    if (tokenizer_file.parent / RUN_CONFIG_FILE).is_file():
        data = saved_config(tokenizer_file.parent).get("data") or {}
        path = next(iter(data.get("mix") or {}), None) or data.get("path")
        if isinstance(path, str) and (Path(path) / MANIFEST_FILE).is_file():
            return read_manifest(path).bos_id
    return document_bos_id(tokenizer_file)


def continue_text(
    model,
    tokenizer,
    prompt: str,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    top_p: float | None = None,
    seed: int = 0,
    bos_id: int | None = None,
) -> str:
    """The prompt ([BOS] first when bos_id is given, as the training documents began) and its sampled continuation,
    decoded; stops early at the end-of-document token."""
    ids = encode_prompt(tokenizer, prompt, bos_id)
    if not ids:
        raise UserError("--prompt encodes to no tokens; give some text")
    device = next(model.parameters()).device
    room = model.args.max_seq_len - 1
    prompt_ids = torch.tensor([ids[-room:]], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    eos_id = _eos_id(tokenizer)
    model.eval()
    out = model.generate(
        prompt_ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
        generator=generator,
    )
    return tokenizer.decode(out[0].tolist(), skip_special_tokens=True)


def _eos_id(tokenizer) -> int | None:
    for token in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"):
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


@dataclass(frozen=True)
class TrainingSampler:
    """What `eval.sample_*` asks for, with the run's tokenizer loaded once."""

    tokenizer: Any
    prompts: list[str]
    every: int
    max_new_tokens: int
    temperature: float
    top_k: int | None
    seed: int
    bos_id: int | None = None
    """What the dataset puts before every document (`document_bos_id`), put before every prompt."""

    def due(self, step: int) -> bool:
        return step % self.every == 0


def build_sampler(config: EvalSection, tokenizer_path: Path | None, data_path: str) -> TrainingSampler | None:
    """None when eval.sample_every is 0; a UserError (before the run folder exists) when the prompts cannot be
    encoded: no tokenizer with the dataset, or a prompt that encodes to no tokens."""
    if not config.sample_every:
        return None
    if tokenizer_path is None:
        raise UserError(
            f"eval.sample_every needs the dataset's {TOKENIZER_FILE} and data.path {data_path} has none; "
            "prepare the dataset with its tokenizer or set eval.sample_every 0"
        )
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    for index, prompt in enumerate(config.sample_prompts):
        if not tokenizer.encode(prompt, add_special_tokens=False).ids:
            raise UserError(f"eval.sample_prompts[{index}] ({prompt!r}) encodes to no tokens; give some text")
    return TrainingSampler(
        tokenizer,
        list(config.sample_prompts),
        config.sample_every,
        config.sample_tokens,
        config.sample_temperature,
        config.sample_top_k,
        config.sample_seed,
        document_bos_id(tokenizer_path),
    )


def sample_during_training(model: torch.nn.Module, sampler: TrainingSampler, step: int) -> list[dict[str, Any]]:
    """One record per prompt: its continuation by `continue_text`, the code `dlx generate` runs. Training goes on
    as if nothing had happened: the model's train/eval mode is restored, and only the sampler's own seeded generator
    draws random numbers (torch's global generators are untouched). Under FSDP and ZeRO-3 every rank must call this
    (the forward gathers the shards); the records are the same on every rank."""
    was_training = model.training
    settings = {"temperature": sampler.temperature, "top_k": sampler.top_k, "seed": sampler.seed}
    try:
        return [
            {
                "step": step,
                "prompt": prompt,
                "text": continue_text(
                    model,
                    sampler.tokenizer,
                    prompt,
                    sampler.max_new_tokens,
                    sampler.temperature,
                    sampler.top_k,
                    None,
                    sampler.seed,
                    sampler.bos_id,
                ),
                **settings,
            }
            for prompt in sampler.prompts
        ]
    finally:
        model.train(was_training)


class SampleObserver(Observer):
    """Text from the model every `eval.sample_every` steps: every rank generates (FSDP and ZeRO-3 forwards gather
    shards); rank 0 prints and writes samples.jsonl, and each record goes to `publish` (every observer's
    `on_sample`)."""

    order = 20

    def __init__(
        self,
        sampler: TrainingSampler,
        model: torch.nn.Module,
        logger: MetricsLogger,
        console: RunConsole,
        publish: Callable[[dict[str, Any]], None],
    ) -> None:
        self.sampler, self.model, self.logger, self.console, self.publish = sampler, model, logger, console, publish

    def header(self) -> list[str]:
        s = self.sampler
        mode = "greedy" if s.temperature == 0 else f"temperature {s.temperature:g}"
        return [
            f"Samples: {len(s.prompts)} prompt(s) every {s.every} steps, {s.max_new_tokens} tokens, {mode}, "
            f"seed {s.seed} -> samples.jsonl"
        ]

    def due(self, step: int) -> bool:
        return self.sampler.due(step)

    def between_steps(self, step: int) -> None:
        if not self.sampler.due(step):
            return
        for record in sample_during_training(self.model, self.sampler, step):
            self.logger.log_sample(record)
            self.console.print(f"sample step {step} | {record['prompt']!r} →\n{record['text']}")
            self.publish(record)
