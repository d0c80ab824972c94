"""Language identification with py3langid's model (it ships inside the package: nothing is downloaded).

py3langid scores a text by naive Bayes over byte n-grams (1 to 4 bytes) that an automaton over the UTF-8 bytes
finds, one Python step per byte. Here the same model gives the same answer with numpy: the automaton's state after
a byte is fixed by the last `depth` bytes alone (the longest suffix of the text it has seen that is a prefix of an
n-gram, never longer than the longest n-gram), so every position's state is `depth` vectorised table look-ups from
the start state, and a state's n-grams are summed into one row of log-probabilities once, at load.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dlx.errors import UserError

CHECK_CHARS = 2000
"""The classifier reads a document's first 2,000 characters (about 6 KB of Chinese, 300 English words): the cost of
a document is bounded whatever its length, and a document whose language changes further on is judged by its opening.
On 6,000-character windows of Python's documentation (English) the verdict on this prefix equals the whole window's
for every window (`benchmarks/bench_curation.py` measures it); on Chinese it is not measured."""


@dataclass(frozen=True)
class _Model:
    classes: tuple[str, ...]
    next_state: np.ndarray
    """(states * 256,) int32: the automaton's next state, at (state << 8) + byte."""
    depth: int
    """The longest path from the start state: the bytes that fix a state."""
    state_scores: np.ndarray
    """(states, languages) float64: the summed log-probabilities of the n-grams a state completes."""
    prior: np.ndarray
    """(languages,) float64: the log prior of each language."""


@functools.cache
def py3langid_identifier():
    """py3langid's own identifier (its model file is part of the package's code)."""
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise UserError("--languages needs py3langid: pip install 'dlx[curate]'") from None
    return LanguageIdentifier.from_pickled_model(MODEL_FILE)


@functools.cache
def _model() -> _Model:
    identifier = py3langid_identifier()
    moves = identifier.tk_nextmove
    next_state = np.frombuffer(moves, dtype=np.dtype(moves.typecode)).astype(np.int32)
    n_states = next_state.size // 256
    ptc = identifier.nb_ptc.astype(np.float64)  # (features, languages)
    state_scores = np.zeros((n_states, ptc.shape[1]))
    for state, features in identifier.tk_output.items():
        state_scores[state] = ptc[list(features)].sum(axis=0)
    prior = np.asarray(identifier.nb_pc, dtype=np.float64)
    return _Model(tuple(identifier.nb_classes), next_state, _depth(next_state), state_scores, prior)


def _depth(next_state: np.ndarray) -> int:
    """The longest shortest path from the start state (breadth first over all 256 bytes)."""
    table = next_state.reshape(-1, 256)
    seen = np.zeros(table.shape[0], dtype=bool)
    seen[0] = True
    frontier, depth = np.array([0]), 0
    while True:
        reached = np.unique(table[frontier])
        frontier = reached[~seen[reached]]
        if frontier.size == 0:
            return depth
        seen[frontier] = True
        depth += 1


def known_languages() -> list[str]:
    """The ISO 639-1 codes the model knows."""
    return list(_model().classes)


def check_languages(codes: list[str]) -> tuple[str, ...]:
    """The codes, each one the model knows; UserError naming the first it does not."""
    known = set(known_languages())
    for code in codes:
        if code not in known:
            raise UserError(
                f"--languages: {code!r} is not a language the identifier knows; use ISO 639-1 codes such as zh, en "
                f"({len(known)} known)"
            )
    if not codes:
        raise UserError("--languages names no language; give codes such as zh,en")
    return tuple(codes)


def detect(text: str, max_chars: int | None = CHECK_CHARS) -> str:
    """The most likely language code of the text's first `max_chars` characters (None: the whole text), as
    py3langid's `classify` answers."""
    model = _model()
    data = np.frombuffer(text[:max_chars].encode("utf-8", errors="surrogatepass"), dtype=np.uint8).astype(np.int32)
    states = np.zeros(data.size, dtype=np.int32)  # (bytes,) the automaton's state after each byte
    for back in range(min(model.depth, data.size) - 1, -1, -1):  # position i reads byte i - back
        states[back:] = model.next_state[(states[back:] << 8) + data[: data.size - back]]
    visits = np.bincount(states, minlength=model.state_scores.shape[0])  # (states,)
    present = visits.nonzero()[0]
    scores = visits[present] @ model.state_scores[present] + model.prior  # (languages,) log-probabilities
    return model.classes[int(scores.argmax())]
