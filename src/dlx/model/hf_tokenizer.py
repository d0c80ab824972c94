"""The tokenizer side of a Hugging Face model folder: what `AutoTokenizer`, `generate`, `pipeline("text-generation")`
and lm-evaluation-harness's `--model hf` read besides the weights.

    tokenizer.json            the tokenizer itself, byte for byte as the dataset was prepared with it
    tokenizer_config.json     tokenizer class, bos/eos/pad tokens, model_max_length
    special_tokens_map.json   bos/eos/pad tokens (older transformers read them from here)
    generation_config.json    bos/eos/pad ids: generation stops at the end-of-document token

The end- and begin-of-document tokens are the ones `dlx prepare` picks for the tokenizer (`document_token_ids`), so the
exported model stops where its training documents ended. Llama 3 has no padding token; the end-of-document token pads,
as is usual. It is not written as `pad_token_id` into config.json: transformers makes that row of the embedding a
`padding_idx`, which would freeze the end-of-document embedding in later fine-tuning.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlx.data.prepare.tokenizer import document_token_ids, load_tokenizer
from dlx.data.shards import TOKENIZER_FILE

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE, GENERATION_CONFIG_FILE)
"""What `dlx import-hf` keeps beside the weights."""
PAD_NAMES = ("<|finetune_right_pad_id|>", "<|pad|>", "<pad>", "[PAD]")


@dataclass(frozen=True)
class SpecialTokens:
    eos: str
    eos_id: int
    bos: str | None
    bos_id: int | None
    pad: str
    pad_id: int


def special_tokens(tokenizer_json: Path) -> SpecialTokens:
    """End/begin-of-document tokens as `dlx prepare` picks them, and a padding token (a dedicated one, else eos)."""
    tokenizer = load_tokenizer(tokenizer_json)
    eos_id, bos_id = document_token_ids(tokenizer_json)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    pad = next((name for name in PAD_NAMES if name in vocab), None)
    pad_id = vocab[pad] if pad is not None else eos_id
    return SpecialTokens(
        eos=tokenizer.id_to_token(eos_id),
        eos_id=eos_id,
        bos=tokenizer.id_to_token(bos_id) if bos_id is not None else None,
        bos_id=bos_id,
        pad=tokenizer.id_to_token(pad_id),
        pad_id=pad_id,
    )


def write_tokenizer_files(tokenizer_json: Path, folder: Path, model_max_length: int) -> SpecialTokens:
    """The four files into `folder` (a temporary folder the caller publishes). A tokenizer_config.json beside the
    source tokenizer.json (an imported model's) is carried over, with the fields above set."""
    tokens = special_tokens(tokenizer_json)
    shutil.copyfile(tokenizer_json, folder / TOKENIZER_FILE)
    named = {"bos_token": tokens.bos, "eos_token": tokens.eos, "pad_token": tokens.pad}
    named = {key: value for key, value in named.items() if value is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        **_read_json(tokenizer_json.parent / TOKENIZER_CONFIG_FILE),
        **named,
        "model_max_length": model_max_length,
    }
    _write_json(folder / TOKENIZER_CONFIG_FILE, config)
    _write_json(folder / SPECIAL_TOKENS_FILE, named)
    ids = {"bos_token_id": tokens.bos_id, "eos_token_id": tokens.eos_id, "pad_token_id": tokens.pad_id}
    _write_json(folder / GENERATION_CONFIG_FILE, {key: value for key, value in ids.items() if value is not None})
    return tokens


def copy_tokenizer_files(source: Path, folder: Path) -> list[str]:
    """The tokenizer files found in `source` (a Hugging Face folder) into `folder`; returns their names."""
    kept = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in kept:
        shutil.copyfile(source / name, folder / name)
    return kept


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
