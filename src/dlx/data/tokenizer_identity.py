"""Whether two tokenizer.json files are the same tokenizer, by content: vocabulary, merges and added (special) tokens.

File bytes are not the test: `tokenizers`, `transformers` and hand edits re-save the same tokenizer with other key
orders, indentation, merges written as `"a b"` or `["a", "b"]`, and fields added with their default values. Those do not
change a single token id; a different vocabulary, merge list or special token does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from dlx.errors import UserError


@dataclass(frozen=True)
class TokenizerIdentity:
    """The parts of a tokenizer that decide its ids, in a canonical form."""

    model_type: str
    vocab: tuple[tuple[str, int], ...]
    merges: tuple[tuple[str, str], ...]
    added_tokens: tuple[tuple[int, str, bool], ...]
    """(id, content, special) of every added token."""

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the canonical form: equal fingerprints, equal tokenizers."""
        text = json.dumps([self.model_type, self.vocab, self.merges, self.added_tokens], ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 over the vocabulary and the added tokens."""
        ids = [i for _, i in self.vocab] + [i for i, _, _ in self.added_tokens]
        return max(ids, default=-1) + 1


def read_identity(path: str | Path) -> TokenizerIdentity:
    """The identity of a tokenizer.json (a file, or a folder holding one); UserError names an unreadable file."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
        vocab = model.get("vocab") or {}
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids by position
            vocab = {piece: index for index, (piece, _score) in enumerate(vocab)}
        merges = tuple(_merge_pair(merge) for merge in model.get("merges") or ())
        added = tuple(
            sorted(
                (int(t["id"]), str(t["content"]), bool(t.get("special", False))) for t in data.get("added_tokens", [])
            )
        )
    except OSError as e:
        raise UserError(f"cannot read tokenizer {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UserError(
            f"{path} is not a Hugging Face tokenizer.json; give the tokenizer.json `tokenizers` wrote"
        ) from None
    return TokenizerIdentity(str(model.get("type", "")), tuple(sorted(vocab.items())), merges, added)


def _merge_pair(merge: str | list[str]) -> tuple[str, str]:
    if isinstance(merge, str):
        left, _, right = merge.partition(" ")
        return left, right
    left, right = merge
    return str(left), str(right)


def describe_difference(a: TokenizerIdentity, b: TokenizerIdentity) -> str | None:
    """None when equal; else the first difference in a few words (for a one-line error)."""
    if a == b:
        return None
    if a.model_type != b.model_type:
        return f"model {a.model_type or '?'} vs {b.model_type or '?'}"
    if a.vocab != b.vocab:
        return f"vocabulary of {a.vocab_size:,} vs {b.vocab_size:,} ids" + (  # added tokens counted: 128,256
            ", same size, other ids" if a.vocab_size == b.vocab_size else ""
        )
    if a.merges != b.merges:
        return f"{len(a.merges):,} vs {len(b.merges):,} merges" + (
            ", same count, other order or pairs" if len(a.merges) == len(b.merges) else ""
        )
    specials_a = {content: i for i, content, _ in a.added_tokens}
    specials_b = {content: i for i, content, _ in b.added_tokens}
    differing = sorted(set(specials_a.items()) ^ set(specials_b.items()))
    return f"added tokens differ ({differing[0][0]!r} …)" if differing else "added tokens differ (special flags)"


def same_tokenizer(a: str | Path, b: str | Path) -> bool:
    """True when the two tokenizer.json files give every text the same ids: the same bytes, else the same identity
    (`read_identity`, which UserErrors on a file that is not a tokenizer.json)."""
    if _same_bytes(Path(a), Path(b)):
        return True
    return read_identity(a) == read_identity(b)


def _same_bytes(a: Path, b: Path) -> bool:
    a, b = (p / "tokenizer.json" if p.is_dir() else p for p in (a, b))
    try:
        return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()
    except OSError:
        return False  # read_identity names the unreadable one


def describe_extension_problem(base: TokenizerIdentity, extended: TokenizerIdentity) -> str | None:
    """None when `extended` is `base`, or `base` with tokens appended as `dlx tokenizer extend` does: every old token
    at its id, the base's merges as a prefix of its merges, every added (special) token kept; else what differs."""
    if base == extended:
        return None
    if base.model_type != extended.model_type:
        return f"model {base.model_type or '?'} vs {extended.model_type or '?'}"
    ids = dict(extended.vocab)
    moved = next((token for token, i in base.vocab if ids.get(token) != i), None)
    if moved is not None:
        return f"the token {moved!r} is not at id {dict(base.vocab)[moved]} (not an extension)"
    if extended.merges[: len(base.merges)] != base.merges:
        return f"its merges do not start with the {len(base.merges):,} merges of the weights' tokenizer"
    missing = set(base.added_tokens) - set(extended.added_tokens)
    if missing:
        return f"the added token {min(missing)[1]!r} is not at id {min(missing)[0]} (not an extension)"
    return None


def is_extension(base: TokenizerIdentity, extended: TokenizerIdentity) -> bool:
    """`extended` holds more tokens than `base` and keeps all of base's (see describe_extension_problem)."""
    return extended.vocab_size > base.vocab_size and describe_extension_problem(base, extended) is None
