"""Extend a byte-level BPE tokenizer with new merges learned on a new corpus, keeping every existing id.

Learning continues the base tokenizer's BPE rather than training a second one: each word of the sample (the base's
normalizer and pre-tokenizer, so words are byte-level strings) starts as the base's own segmentation of it, and the most
frequent adjacent pair is merged, N times. Because the new merges rank after every base merge, the extended tokenizer
first reproduces the base segmentation and only then applies new merges, each of which makes a new token: every new
merge is reachable, and text whose encoding holds no new id encodes exactly as the base encodes it. A pair whose
concatenation is already a base token is never merged (it would change old-domain encodings without adding a token).

New tokens take ids after the last existing id, special tokens included (Llama 3's 128000-128255 stay where they are).
The extended tokenizer.json also lists every added token in the model's vocabulary at its id (see `extend_json`).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from dlx.errors import UserError

Pair = tuple[str, str]


@dataclass(frozen=True)
class Density:
    """How much text a token carries on a sample."""

    chars: int
    bytes: int
    tokens: int

    @property
    def chars_per_token(self) -> float:
        return self.chars / max(1, self.tokens)

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / max(1, self.tokens)


def read_base(path: Path) -> dict[str, Any]:
    """A tokenizer.json as JSON, checked to be a byte-level BPE (the only kind extension keeps lossless)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"cannot read tokenizer {path} ({e}); give a Hugging Face tokenizer.json") from None
    model = data.get("model") if isinstance(data, dict) else None
    byte_level = "ByteLevel" in json.dumps(data.get("pre_tokenizer") if isinstance(data, dict) else None)
    if not isinstance(model, dict) or model.get("type") != "BPE" or not byte_level:
        kind = model.get("type") if isinstance(model, dict) else "?"
        raise UserError(
            f"{path} is a {kind} tokenizer without a ByteLevel pre-tokenizer; dlx extends byte-level BPE tokenizers "
            "only (Llama 3, GPT-2 style): give one of those"
        )
    return data


def word_counts(base: Tokenizer, texts: Iterable[str]) -> Counter[str]:
    """The sample's pre-tokenized words (byte-level strings) and how often each occurs."""
    counts: Counter[str] = Counter()
    for text in texts:
        if base.normalizer is not None:
            text = base.normalizer.normalize_str(text)
        counts.update(piece for piece, _ in base.pre_tokenizer.pre_tokenize_str(text))
    return counts


def learn_merges(base: Tokenizer, words: Counter[str], n_tokens: int) -> list[Pair]:
    """Up to `n_tokens` merges, each making a token the base does not have, most frequent pair first (ties: the
    smaller pair), starting from the base's segmentation of every word."""
    known = set(base.get_vocab(with_added_tokens=True))
    pieces = [[t.value for t in base.model.tokenize(word)] for word in words]
    freqs = list(words.values())
    counts: Counter[Pair] = Counter()
    where: defaultdict[Pair, set[int]] = defaultdict(set)
    for i, word in enumerate(pieces):
        for pair in itertools.pairwise(word):
            counts[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-count, pair) for pair, count in counts.items()]
    heapq.heapify(heap)
    merges: list[Pair] = []
    while heap and len(merges) < n_tokens:
        negative, pair = heapq.heappop(heap)
        count = counts.get(pair, 0)
        if count <= 0 or pair[0] + pair[1] in known:
            continue
        if count != -negative:  # stale entry: the pair's count changed since it was pushed
            heapq.heappush(heap, (-count, pair))
            continue
        merges.append(pair)
        known.add(pair[0] + pair[1])
        changed = _merge_everywhere(pair, pieces, freqs, counts, where)
        for other in changed:
            if counts[other] > 0:
                heapq.heappush(heap, (-counts[other], other))
    return merges


def _merge_everywhere(
    pair: Pair, pieces: list[list[str]], freqs: list[int], counts: Counter[Pair], where: defaultdict[Pair, set[int]]
) -> set[Pair]:
    """Merge `pair` in every word holding it, updating the pair counts; returns the pairs whose count grew (those
    that hold the new token: every other pair's count only fell or stayed)."""
    token = pair[0] + pair[1]
    grown: set[Pair] = set()
    for i in sorted(where.pop(pair, ())):
        word, freq = pieces[i], freqs[i]
        for old in itertools.pairwise(word):
            counts[old] -= freq
        merged = _merge_word(word, pair)
        pieces[i] = merged
        for new in itertools.pairwise(merged):
            counts[new] += freq
            where[new].add(i)
            if token in new:
                grown.add(new)
    counts.pop(pair, None)
    return grown


def _merge_word(word: list[str], pair: Pair) -> list[str]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def extend_json(base: dict[str, Any], merges: Sequence[Pair]) -> tuple[dict[str, Any], int]:
    """The base tokenizer.json with the merges appended and their tokens given ids after the last existing id;
    returns it and the first new id."""
    extended = copy.deepcopy(base)
    model = extended["model"]
    added = {str(t["content"]): int(t["id"]) for t in extended.get("added_tokens") or ()}
    first = max([*model["vocab"].values(), *added.values()], default=-1) + 1
    # `tokenizers` gives an added token that is not in the model's vocabulary the id after the vocabulary's size on
    # load: with new tokens appended above Llama 3's specials they would move. In the vocabulary they keep their ids
    # (the BPE never produces them: no merge makes them, and the added vocabulary splits them out of the text first).
    for content, token_id in added.items():
        model["vocab"].setdefault(content, token_id)
    as_strings = bool(model["merges"]) and isinstance(model["merges"][0], str)
    for offset, (left, right) in enumerate(merges):
        model["vocab"][left + right] = first + offset
        model["merges"].append(f"{left} {right}" if as_strings else [left, right])
    return extended, first


def density(tokenizer: Tokenizer, texts: Sequence[str]) -> Density:
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(list(texts), add_special_tokens=False))
    return Density(sum(map(len, texts)), sum(len(t.encode("utf-8")) for t in texts), tokens)


def base_pieces(base: Tokenizer, extended: Tokenizer, first_new: int, vocab_size: int) -> list[list[int]]:
    """For each id from `first_new` up to `vocab_size`: the base ids its token splits into under the base's BPE (empty
    when the extended tokenizer has no such id, e.g. padding rows)."""
    out = []
    for new_id in range(first_new, vocab_size):
        token = extended.id_to_token(new_id)
        out.append([t.id for t in base.model.tokenize(token)] if token is not None else [])
    return out


@dataclass(frozen=True)
class Extension:
    """What `extend_tokenizer` wrote and measured."""

    out: Path
    base_vocab_size: int
    first_new_id: int
    added: int
    before: Density
    after: Density


CARRIED_FILES = ("tokenizer_config.json", "special_tokens_map.json")
"""Files beside the base tokenizer.json copied next to the extended one (they name the special tokens)."""


def sample_corpus(specs: Sequence[str], max_chars: int, text_field: str = "text") -> list[str]:
    """The corpus's first documents, about `max_chars` characters: the inputs `dlx prepare` reads (files, folders,
    globs; plain text, JSON lines or arrays, Parquet, compressed), JSON's and Parquet's text in `text_field`."""
    from dlx.data.prepare.inputs import InputList
    from dlx.data.prepare.readers import missing_field_hint, sample_documents
    from dlx.data.prepare.units import choose_unit_bytes, plan_units

    inputs = InputList(tuple(specs)).measure()
    bad: list[str] = []
    texts = sample_documents(plan_units(inputs, choose_unit_bytes(inputs.bytes)), text_field, max_chars, bad)
    if not texts:
        hint = missing_field_hint(bad)
        raise UserError(
            f"the corpus {' '.join(specs)} holds no text"
            + (f": {hint}" if hint else "; give files with the new domain's text")
        )
    return texts


def extend_tokenizer(
    base_path: Path, corpus: Sequence[str], add: int, out: Path, sample_chars: int, text_field: str = "text"
) -> Extension:
    """Learn `add` new tokens on a sample of `corpus` (JSON's and Parquet's text in `text_field`), append them to the
    base tokenizer and write it into `out`."""
    from dlx.atomic import atomic_dir
    from dlx.data.prepare.tokenizer import tokenizer_file

    if add < 1:
        raise UserError(f"--add {add}: give the number of new tokens to learn, at least 1 (e.g. --add 16000)")
    if out.exists():
        raise UserError(f"{out} already exists; choose another output folder or remove it")
    path = tokenizer_file(base_path)
    data = read_base(path)
    base = Tokenizer.from_str(json.dumps(data))
    texts = sample_corpus(corpus, sample_chars, text_field)
    merges = learn_merges(base, word_counts(base, texts), add)
    extended_json, first = extend_json(data, merges)
    extended = Tokenizer.from_str(json.dumps(extended_json))
    with atomic_dir(out) as tmp:
        (tmp / "tokenizer.json").write_text(json.dumps(extended_json, indent=2, ensure_ascii=False) + "\n", "utf-8")
        for name in CARRIED_FILES:
            if (path.parent / name).is_file():
                (tmp / name).write_bytes((path.parent / name).read_bytes())
    return Extension(out, base.get_vocab_size(True), first, len(merges), density(base, texts), density(extended, texts))
