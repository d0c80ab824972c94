"""Language identification with py3langid (its model ships inside the package: nothing is downloaded)."""

from __future__ import annotations

import functools

from dlx.errors import UserError

CHECK_CHARS = 400  # the classifier reads the document's first characters: enough for a stable answer


@functools.cache
def _identifier():
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise UserError("--languages needs py3langid: pip install 'dlx[curate]'") from None
    return LanguageIdentifier.from_pickled_model(MODEL_FILE)  # the package's own model file, part of its code


def known_languages() -> list[str]:
    """The ISO 639-1 codes the model knows."""
    return list(_identifier().nb_classes)


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


def detect(text: str) -> str:
    """The most likely language code of the text."""
    identifier = _identifier()
    features = identifier.instance2fv(text[:CHECK_CHARS])  # (features,) counts, a few dozen non-zero
    present = features.nonzero()[0]
    # py3langid's own scoring (nb_classprobs), over the features present only: a dense product over all 7,480
    # features costs ten times more, and more again when BLAS threads fight for the cores
    scores = features[present] @ identifier.nb_ptc[present] + identifier.nb_pc  # (languages,) log-probabilities
    return identifier.nb_classes[int(scores.argmax())]
