"""Near copies of code through a comment: a short function with one comment line added (Python `#`, C `//` and
`/* */`) has the very shingles of the original, so deduplication finds it; two functions that differ only in their
docstrings stay two; a long document's curation says when it starts and ends."""

from __future__ import annotations

from dlx.data.curate import stages
from dlx.data.curate.code import code_tokens
from dlx.data.curate.dedup import find_duplicates
from dlx.data.curate.spec import build_spec
from dlx.data.curate.stages import Curator
from dlx.data.curate.text import shingles

SHORT = "def area(radius):\n    pi = 3.14159\n    return pi * radius ** 2\n"
C_SHORT = "#include <math.h>\nstatic double area(double r) {\n    return M_PI * r * r;\n}\n"


def test_a_comment_line_leaves_a_short_function_s_shingles_unchanged():
    commented = "def area(radius):\n    # the constant, to five places\n    pi = 3.14159\n    return pi * radius ** 2\n"
    assert (shingles(commented, 5, True) == shingles(SHORT, 5, True)).all()
    c_commented = C_SHORT.replace("{\n", "{  // r in metres\n    /* the\n       area */\n")
    assert code_tokens(c_commented) == code_tokens(C_SHORT)
    assert code_tokens('x = "# not a comment"  # a comment\n') == ["I", "=", '"# not a comment"']


def test_commented_copies_are_found_and_docstring_twins_kept():
    getter = 'def {name}(self):\n    """{doc}"""\n    return self._{name}\n'
    texts = [
        SHORT,
        "def area(radius):\n    pi = 3.14159  # close enough\n\n\n    return pi * radius ** 2\n",
        C_SHORT,
        C_SHORT.replace("    return", "    /* pi r squared */\n    return"),
        getter.format(name="labels", doc="Return the labels on the message."),
        getter.format(name="sequences", doc="Return the sequences that include the message."),
    ]
    curator = Curator(build_spec(dedup="near"), signatures=True)
    for i, text in enumerate(texts):
        curator.sign(0, i, text, i, "x.py")
    reason, _, original = find_duplicates(curator.take_signatures(), near=True)
    assert reason.tolist() == [0, 2, 0, 2, 0, 0]
    assert original.tolist() == [0, 0, 2, 2, 4, 5]


def test_a_long_document_says_when_its_curation_starts_and_ends(monkeypatch, capsys):
    monkeypatch.setattr(stages, "LONG_DOCUMENT_CHARS", 1000)
    curator = Curator(build_spec(pii="redact", sources=[("corpus", "/")]), signatures=False)
    counts: dict = {"sources": {}, "examples": {}}
    curator.process("a@b.cn " + "x" * 2000, "/data/big.txt", counts)
    curator.process("short", "/data/small.txt", counts)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "curation: a document of 0.0 M characters (file /data/big.txt)"
    assert lines[1].startswith("curation: done in ") and len(lines) == 2
