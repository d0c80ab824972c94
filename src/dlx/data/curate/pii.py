"""PII redaction: e-mail addresses, IPv4 addresses, PRC resident ID numbers (only those whose check digit is right),
phone numbers (Chinese mobile and landline, international +CC forms) replaced by placeholders, and counted."""

from __future__ import annotations

import re
from collections import Counter

PLACEHOLDERS = {"email": "<EMAIL>", "ip": "<IP>", "prc_id": "<ID>", "phone": "<PHONE>"}
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
_PRC_ID = re.compile(
    r"(?<![0-9A-Za-z])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx](?![0-9A-Za-z])"
)
_PHONE = re.compile(
    r"(?<![0-9A-Za-z+])(?:(?:\+|00)86[- ]?)?1[3-9]\d{9}(?!\d)"  # Chinese mobile
    r"|(?<![0-9A-Za-z])0\d{2,3}-\d{7,8}(?!\d)"  # Chinese landline with its area code
    r"|(?<![0-9A-Za-z+])\+\d{1,3}[ -]?(?:\(\d{1,4}\)[ -]?)?\d{2,4}(?:[ -]?\d{2,4}){1,3}(?!\d)"  # international
)
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"


def prc_id_valid(number: str) -> bool:
    """The 18th character of a PRC resident ID is the ISO 7064 MOD 11-2 check of the first 17 digits."""
    total = sum(int(d) * w for d, w in zip(number[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == number[17].upper()


def _ip_valid(address: str) -> bool:
    return all(int(part) <= 255 for part in address.split("."))


def redact(text: str, counts: Counter) -> str:
    """The text with PII replaced by PLACEHOLDERS, adding what was replaced to counts (by kind)."""

    def replace(kind: str, valid=None):
        def sub(match: re.Match) -> str:
            if valid is not None and not valid(match.group(0)):
                return match.group(0)
            counts[kind] += 1
            return PLACEHOLDERS[kind]

        return sub

    text = _EMAIL.sub(replace("email"), text)
    text = _PRC_ID.sub(replace("prc_id", prc_id_valid), text)
    text = _IPV4.sub(replace("ip", _ip_valid), text)
    return _PHONE.sub(replace("phone"), text)
