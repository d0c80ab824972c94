"""Source code as curation reads it: whether an undeclared text is code (`looks_like_code`), its tokens for near-copy
shingles with identifiers blinded and comments dropped (`code_tokens`), and which of its lines are comments.

Comments are `//` and `/* */` (C-like languages) and `#` (Python, shell, Ruby, Perl; not a C preprocessor
directive). A Python docstring (a triple-quoted string that opens its line) is prose to code detection, and one
string token to the shingles: two functions that differ only in their docstrings are two functions. Every pattern here
runs in time linear in the text: a string, comment or docstring left open runs to the end of its line (strings) or
of the text (block comments, triple-quoted strings), so no start position is scanned twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DIRECTIVES = "include|define|undef|if|ifdef|ifndef|elif|else|endif|pragma|error|warning|line|import|region|endregion"
_C_PREPROCESSOR = re.compile(
    r"^[ \t]*#[ \t]*(?:include[ \t]*[<\"]|define[ \t]+[A-Za-z_]\w*|ifn?def[ \t]+\w+[ \t]*$|endif\b|pragma[ \t])",
    re.MULTILINE,
)
"""A line only C, C++ and their kin write: in such a document `#` starts a directive; elsewhere, a comment."""
_TRIPLE = r"\"\"\"[\s\S]*?(?:\"\"\"|\Z)|'''[\s\S]*?(?:'''|\Z)"
_DOCSTRING = rf"^[ \t]*(?:{_TRIPLE})"
"""A triple-quoted string that opens its line: a docstring (or a block of text), prose for code detection."""
_STRING = r"\"(?:\\.|[^\"\\\n])*(?:\"|$)|'(?:\\.|[^'\\\n])*(?:'|$)"


@dataclass(frozen=True)
class CommentSyntax:
    """The patterns of one comment syntax: `#` a comment always (Python, shell), or only when no preprocessor
    directive follows it (C-like)."""

    token: re.Pattern
    skippable: re.Pattern
    comment_line: re.Pattern


def _syntax(hash_comment: str) -> CommentSyntax:
    comment = rf"/\*[\s\S]*?(?:\*/|\Z)|//[^\n]*|{hash_comment}"
    return CommentSyntax(
        re.compile(rf"(?P<skip>{comment})|{_TRIPLE}|{_STRING}|[A-Za-z_]\w*|\d+(?:\.\d+)?|\S", re.MULTILINE),
        re.compile(rf"(?P<skip>{_DOCSTRING}|{comment})|{_TRIPLE}|{_STRING}", re.MULTILINE),
        re.compile(rf"\s*(?://|/\*|\*|{hash_comment}|<!--)"),
    )


_HASH_ALWAYS = _syntax(r"#[^\n]*")
_HASH_BUT_DIRECTIVES = _syntax(rf"#(?!\s*(?:{DIRECTIVES})\b)[^\n]*")


def comment_syntax(text: str) -> CommentSyntax:
    """The patterns that read `text`'s comments: C-like when a line of it is a preprocessor directive."""
    return _HASH_BUT_DIRECTIVES if _C_PREPROCESSOR.search(text) else _HASH_ALWAYS


_CODE_LINE = re.compile(
    r"\s*(?:#\s*(?:" + DIRECTIVES + r")\b|import |from \S+ import |def |class |async def |@\w|public |private |"
    r"protected |static |const |let |var |int |void |char |long |unsigned |struct |enum |typedef |extern |using |"
    r"package |func |fn |impl |return\b|raise\b|yield\b|assert\b|try:|except\b|finally:|elif\b|else\b|for ?\(|"
    r"while ?\(|if ?\(|switch ?\(|case\b|}|[A-Za-z_][\w.]*(?:\[[^\]\n]{0,80}\])?\s*(?:[-+*/%|&^]|<<|>>)?=[^=])"
)
_STRONG_ENDINGS = (";", "{", "}")
_WEAK_ENDINGS = (":", ")", "(", "[", "]", ",", "\\")
"""Line ends that hard-wrapped prose also has: they count half."""
_KEYWORD_TEXT = """
and as assert async await break case catch char class const continue def default del do double elif
else enum except extern false final finally float for from func go if import in int is lambda let
long namespace new nil none not null or package pass private protected public raise return self
short signed sizeof static std string struct super switch template this throw true try typedef
unsigned using var void while with yield include define cin cout endl printf scanf print input
range len main vector map set list
"""
KEYWORDS = frozenset(_KEYWORD_TEXT.split())
"""Code words kept as they are in code shingles (identifiers become `I`)."""


def code_tokens(text: str) -> list[str]:
    """Tokens of source code with identifiers replaced by `I` (keywords kept), literals (docstrings too) and
    operators as written, comments dropped: a renamed variable, a reformatted layout or a comment added or removed
    leaves the sequence unchanged, while programs that differ in their numbers, strings or operators (what they
    compute) do not."""
    tokens = []
    for match in comment_syntax(text).token.finditer(text):
        if match.lastgroup == "skip":
            continue
        tok = match.group(0)
        tokens.append(tok if not (tok[0].isalpha() or tok[0] == "_") or tok.lower() in KEYWORDS else "I")
    return tokens


def without_comments(text: str) -> str:
    """The text with comments and docstrings removed (strings kept whole, so `"#"` or `"//"` in a literal stays)."""
    return comment_syntax(text).skippable.sub(lambda m: "" if m.lastgroup == "skip" else m.group(0), text)


def comment_lines(lines: list[str], text: str) -> int:
    """How many of a document's lines start with a comment: `//`, `/*`, `*`, `<!--`, or `#` (in a C-like document,
    `comment_syntax`, one that starts no directive)."""
    pattern = comment_syntax(text).comment_line
    return sum(1 for line in lines if pattern.match(line))


def looks_like_code(text: str) -> bool:
    """Source code by its lines, comments and docstrings left out: at least two, and a third or more of them start
    like a statement, a declaration or an assignment or end in `;`, `{` or `}` (a line ending in `:`, `)`, `,` or a
    bracket, as wrapped prose also does, counts half)."""
    lines = [line.rstrip() for line in without_comments(text).splitlines() if line.strip()]
    if len(lines) < 2:
        return False
    strong = weak = 0
    for line in lines:
        if _CODE_LINE.match(line) or line.endswith(_STRONG_ENDINGS):
            strong += 1
        elif line.endswith(_WEAK_ENDINGS):
            weak += 1
    return (2 * strong + weak) * 3 >= 2 * len(lines)
