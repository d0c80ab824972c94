"""Decontamination: a training document that shares an n-gram with an evaluation task's document is removed.

N-grams are over normalised words (NFKC, lower case, punctuation and whitespace dropped), each CJK character a word
of its own, so Chinese is matched by runs of characters. The task documents are rendered as lm-eval renders them
(context and answer) by whoever resolves the tasks; here they are text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from dlx.data.curate.text import ngram_hashes, token_ids, word_tokens

DEFAULT_NGRAM = 13


@dataclass(frozen=True)
class TaskIndex:
    """Every n-gram hash of the task documents, sorted, with the task each came from."""

    names: tuple[str, ...]
    hashes: np.ndarray
    """(ngrams,) uint64, sorted."""
    owners: np.ndarray
    """(ngrams,) int32: index into `names`."""
    n: int
    documents: tuple[int, ...]
    """Task documents per task."""
    short: tuple[int, ...]
    """Task documents with fewer than n words (not checked)."""

    def fingerprint(self) -> str:
        """SHA-256 of the n-grams, for the manifest: other task documents make another dataset."""
        return hashlib.sha256(self.hashes.tobytes() + self.owners.tobytes()).hexdigest()

    def match(self, text: str) -> str | None:
        """The first task (in the order given) that shares an n-gram with the text, None when none does."""
        ids = token_ids(word_tokens(text))
        if ids.size < self.n or self.hashes.size == 0:
            return None
        grams = ngram_hashes(ids, self.n)
        pos = np.searchsorted(self.hashes, grams)
        pos[pos == self.hashes.size] = 0
        hit = self.hashes[pos] == grams
        if not hit.any():
            return None
        return self.names[int(self.owners[pos[hit]].min())]


def build_index(task_texts: dict[str, list[str]], n: int) -> TaskIndex:
    """The index of every task's documents."""
    hashes, owners, documents, short = [], [], [], []
    for i, texts in enumerate(task_texts.values()):
        n_short = 0
        for text in texts:
            ids = token_ids(word_tokens(text))
            if ids.size < n:
                n_short += 1
                continue
            grams = ngram_hashes(ids, n)
            hashes.append(grams)
            owners.append(np.full(grams.size, i, dtype=np.int32))
        documents.append(len(texts))
        short.append(n_short)
    all_hashes = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    all_owners = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int32)
    order = np.lexsort((all_owners, all_hashes))  # by hash, then the first task
    return TaskIndex(tuple(task_texts), all_hashes[order], all_owners[order], n, tuple(documents), tuple(short))
