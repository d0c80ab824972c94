"""Source code as curation reads it: whether an undeclared text is code (`looks_like_code`), its tokens for near-copy
shingles with identifiers blinded and comments dropped (`code_tokens`), and which of its lines are comments.

Comments are `//` and `/* */` (C-like languages), `#` (Python, shell, Ruby, Perl; not a C preprocessor directive)
and, in Python, a triple-quoted string that opens a line (a docstring). Every pattern here runs in time linear in the
text: a string, comment or docstring left open runs to the end of its line (strings) or of the text (block comments,
docstrings), so no start position is scanned twice.
"""

from __future__ import annotations

import re

DIRECTIVES = "include|define|undef|if|ifdef|ifndef|elif|else|endif|pragma|error|warning|line|import|region|endregion"
_HASH_COMMENT = rf"#(?!\s*(?:{DIRECTIVES})\b)[^\n]*"
_COMMENT_OR_DOCSTRING = (
    r"^[ \t]*(?:\"\"\"[\s\S]*?(?:\"\"\"|\Z)|'''[\s\S]*?(?:'''|\Z))"  # a docstring: opens its line
    r"|/\*[\s\S]*?(?:\*/|\Z)"
    r"|//[^\n]*"
    rf"|{_HASH_COMMENT}"
)
_STRING = r"\"(?:\\.|[^\"\\\n])*(?:\"|$)|'(?:\\.|[^'\\\n])*(?:'|$)"
_TOKEN = re.compile(rf"(?P<skip>{_COMMENT_OR_DOCSTRING})|{_STRING}|[A-Za-z_]\w*|\d+(?:\.\d+)?|\S", re.MULTILINE)
_SKIPPABLE = re.compile(rf"(?P<skip>{_COMMENT_OR_DOCSTRING})|{_STRING}", re.MULTILINE)
_COMMENT_LINE = re.compile(rf"\s*(?://|/\*|\*|{_HASH_COMMENT}|<!--)")
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
    """Tokens of source code with identifiers replaced by `I` (keywords kept), literals and operators as written,
    comments and docstrings dropped: a renamed variable, a reformatted layout or a comment added or removed leaves the
    sequence unchanged, while programs that differ in their numbers, strings or operators (what they compute) do
    not."""
    tokens = []
    for match in _TOKEN.finditer(text):
        if match.lastgroup == "skip":
            continue
        tok = match.group(0)
        tokens.append(tok if not (tok[0].isalpha() or tok[0] == "_") or tok.lower() in KEYWORDS else "I")
    return tokens


def without_comments(text: str) -> str:
    """The text with comments and docstrings removed (strings kept whole, so `"#"` or `"//"` in a literal stays)."""
    return _SKIPPABLE.sub(lambda m: "" if m.lastgroup == "skip" else m.group(0), text)


def is_comment_line(line: str) -> bool:
    """Whether a line of code starts with a comment (`//`, `/*`, `*`, `#` that is no directive, `<!--`)."""
    return _COMMENT_LINE.match(line) is not None


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
