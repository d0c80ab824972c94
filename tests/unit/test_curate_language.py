"""Language identification: dlx's vectorised scoring answers as py3langid's own `classify` does."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("py3langid")

from dlx.data.curate import language

SAMPLES = [
    "Hello world, this is an English sentence about the weather and the long road home.",
    "这是一个中文句子，关于天气和回家的长路。今天下雨了，我们待在家里读书。",
    "Ceci est une phrase en français, écrite pour vérifier la langue du texte.",
    "Dies ist ein deutscher Satz, der die Sprache des Textes prüfen soll.",
    "Привет, мир! Это предложение написано по-русски.",
    "これは日本語の文です。天気について書いています。",
    'int main() { printf("%d\\n", 42); return 0; }',
    "",
    "a",
]


def _random_texts(n: int) -> list[str]:
    rng = random.Random(3)
    alphabet = "abcdefghij klmnop,.ÄÖü中文字句子。日本語ですΑλφα  \n\t0123456789{}()"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 600))) for _ in range(n)]


def test_detect_answers_as_py3langid_classify():
    identifier = language.py3langid_identifier()
    texts = SAMPLES + _random_texts(200)
    for text in texts:
        assert language.detect(text, max_chars=None) == identifier.classify(text)[0], text[:40]


def test_detect_reads_a_bounded_prefix():
    text = "这是一个中文句子，关于天气。" * 10 + "This is English text, a long tail of it. " * 200
    assert language.detect(text, max_chars=None) == "en"
    assert language.detect(text, max_chars=140) == "zh"
    assert language.detect(text) == language.detect(text[: language.CHECK_CHARS], max_chars=None)


def test_unknown_language_code_is_refused():
    from dlx.errors import UserError

    with pytest.raises(UserError, match="'xx' is not a language"):
        language.check_languages(["zh", "xx"])
