"""PII redaction: e-mail addresses, public IPv4 addresses, PRC resident ID numbers (only those whose check digit is
right), phone numbers (Chinese mobile and landline, international +CC forms) and secrets (cloud and API keys, access
tokens, private-key blocks, a quoted value assigned to a `password`/`secret`/`api_key`-like name) replaced by
placeholders, and counted by kind.

Which kinds apply depends on the document's kind (DEFAULT_KINDS): source code keeps its addresses and numbers
(`HOST = '127.0.0.1'`, a port, a version) and loses only e-mail addresses and secrets unless asked. An IPv4 address
is redacted only when it is public (`ipaddress`'s `is_global`: loopback, private, link-local, shared, reserved and
documentation ranges are kept), and not when it reads as a version (`v1.2.3.4`, `version 10.0.2.15`, an octet with
a leading zero).

Every pattern runs in time linear in the text: each can only start where the character before cannot continue it (a
lookbehind), and every repetition inside it is bounded, so no start position is scanned more than a bounded number
of characters ahead.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Callable

PLACEHOLDERS = {"email": "<EMAIL>", "ip": "<IP>", "prc_id": "<ID>", "phone": "<PHONE>", "secret": "<SECRET>"}
PII_KINDS = tuple(PLACEHOLDERS)
DEFAULT_KINDS = {"prose": ("email", "ip", "prc_id", "phone", "secret"), "code": ("email", "secret")}
"""What is redacted in each kind of document unless the spec says otherwise."""
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}(?![A-Za-z0-9-])"
)
_IPV4 = re.compile(r"(?<![A-Za-z0-9_.])(?:\d{1,3}\.){3}\d{1,3}(?!\d|\.\d)")
_VERSION_BEFORE = re.compile(r"(?:\bv|version|\bver\.?|release|python|kernel|版本)[\s_'\"=:]{0,6}$", re.IGNORECASE)
_PRC_ID = re.compile(
    r"(?<![0-9A-Za-z])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx](?![0-9A-Za-z])"
)
_PHONE = re.compile(
    r"(?<![0-9A-Za-z+])(?:(?:\+|00)86[- ]?)?1[3-9]\d{9}(?!\d)"  # Chinese mobile
    r"|(?<![0-9A-Za-z])0\d{2,3}-\d{7,8}(?!\d)"  # Chinese landline with its area code
    r"|(?<![0-9A-Za-z+])\+\d{1,3}[ -]?(?:\(\d{1,4}\)[ -]?)?\d{2,4}(?:[ -]?\d{2,4}){1,3}(?!\d)"  # international
)
_SECRET_SHAPES = (
    (("AKIA", "ASIA"), r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])"),  # AWS access key id
    (
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
        r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36,251}(?![A-Za-z0-9_])",
    ),  # GitHub token
    (("github_pat_",), r"(?<![A-Za-z0-9_-])github_pat_[A-Za-z0-9_]{60,251}"),
    (("xox",), r"(?<![A-Za-z0-9-])xox[abposr]-[A-Za-z0-9-]{10,250}"),  # Slack token
    (("AIza",), r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"),  # Google API key
    (("sk-",), r"(?<![A-Za-z0-9_-])sk-(?:proj-|ant-)?[A-Za-z0-9_-]{32,200}(?![A-Za-z0-9_-])"),  # OpenAI, Anthropic
    (
        ("PRIVATE KEY",),
        r"-----BEGIN (?:[A-Z]{1,12} ){0,2}PRIVATE KEY(?: BLOCK)?-----[\s\S]{1,16000}?-----END [A-Z ]{1,40}-----",
    ),
)
"""(literals, one of which every match holds; the pattern): a text without them is not searched."""
_SECRETS = [(hints, re.compile(pattern)) for hints, pattern in _SECRET_SHAPES]
_ASSIGNED_HINTS = ("key", "token", "secret", "passw")
_ASSIGNED_SECRET = re.compile(
    r"(?<![A-Za-z0-9_])(?i:(?:api|access|auth|secret|private|client)[_-]?(?:key|token|secret)|password|passwd|"
    r"secret)[\"']?\s{0,4}[:=]{1,2}\s{0,4}[bru]{0,2}(?P<quote>[\"'])(?P<value>[^\"'\s]{8,200})(?P=quote)"
)
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"


def prc_id_valid(number: str) -> bool:
    """The 18th character of a PRC resident ID is the ISO 7064 MOD 11-2 check of the first 17 digits."""
    total = sum(int(d) * w for d, w in zip(number[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == number[17].upper()


def public_address(match: re.Match) -> bool:
    """A public IPv4 address that does not read as a version number."""
    octets = match.group(0).split(".")
    if any(len(o) > 1 and o[0] == "0" for o in octets):  # 10.04.1.0: an address never writes a leading zero
        return False
    if _VERSION_BEFORE.search(match.string, max(0, match.start() - 20), match.start()):
        return False
    try:
        return ipaddress.IPv4Address(match.group(0)).is_global
    except ValueError:  # an octet above 255
        return False


def _valid_id(match: re.Match) -> bool:
    return prc_id_valid(match.group(0))


PATTERNS: dict[str, tuple[re.Pattern, Callable[[re.Match], bool] | None]] = {
    "email": (_EMAIL, None),
    "prc_id": (_PRC_ID, _valid_id),
    "ip": (_IPV4, public_address),
    "phone": (_PHONE, None),
}
"""Each kind's pattern and the check a match must pass, in the order they apply, after secrets."""


def redact(text: str, counts: Counter, kinds: tuple[str, ...] = PII_KINDS) -> str:
    """The text with the PII of `kinds` replaced by PLACEHOLDERS, adding what was replaced to counts (by kind)."""
    if "secret" in kinds:
        text = _secrets(text, counts)
    for kind, (pattern, valid) in PATTERNS.items():
        if kind in kinds and (kind != "email" or "@" in text):
            text = pattern.sub(_replacer(kind, valid, counts), text)
    return text


def _secrets(text: str, counts: Counter) -> str:
    """Secrets by their shapes (each searched for only when the text holds its literal), then assigned ones."""
    for hints, pattern in _SECRETS:
        if any(hint in text for hint in hints):
            text = pattern.sub(_replacer("secret", None, counts), text)
    lowered = text.lower()
    if any(hint in lowered for hint in _ASSIGNED_HINTS):
        text = _ASSIGNED_SECRET.sub(_assigned(counts), text)
    return text


def _replacer(kind: str, valid: Callable[[re.Match], bool] | None, counts: Counter) -> Callable[[re.Match], str]:
    def sub(match: re.Match) -> str:
        if valid is not None and not valid(match):
            return match.group(0)
        counts[kind] += 1
        return PLACEHOLDERS[kind]

    return sub


def _assigned(counts: Counter) -> Callable[[re.Match], str]:
    """The quoted value of `password = "..."` replaced, the name and quotes kept."""

    def sub(match: re.Match) -> str:
        if match.group("value") == PLACEHOLDERS["secret"]:
            return match.group(0)
        counts["secret"] += 1
        start, end = match.span("value")
        return match.group(0)[: start - match.start()] + PLACEHOLDERS["secret"] + match.group(0)[end - match.start() :]

    return sub
