"""Real documents of six kinds, read from packages installed on this machine (nothing is downloaded at run time):

- zh_verse: Tang poems, Song ci, Shijing, Chuci, Yuan qu, one poem with its title and author a document: Debian
  `fortunes-zh` (tang300, song100) and, when installed, npm `chinese-poetry` (`npm install -g chinese-poetry`);
- zh_classical: classical Chinese prose, Guwen Guanzhi essays, Analects and Mencius chapters (npm `chinese-poetry`),
  Daodejing chapters (Debian `fortunes-zh`);
- zh_prose: modern Chinese prose, the Debian Reference and FAQ in Simplified Chinese, one section a document (Debian
  `debian-reference-zh-cn`, `debian-faq-zh-cn`);
- en_prose: English prose, the Debian Reference and FAQ, one section a document (`debian-reference-en`, `debian-faq`);
- python: whole Python standard-library modules (the Python running this program);
- c: C headers and sources under /usr/include (Debian `libc6-dev`, `linux-libc-dev` and other -dev packages).

`documents(kind)` raises Missing naming the package to install when none of a kind's sources is on disk. Texts are
deduplicated (exactly) so that the measures count unique documents.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import subprocess
import sysconfig
from pathlib import Path

KINDS = ("zh_verse", "zh_classical", "zh_prose", "en_prose", "python", "c")
FORTUNES = Path("/usr/share/games/fortunes")
REFERENCE = Path("/usr/share/debian-reference")
FAQ = Path("/usr/share/doc/debian/FAQ")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
HEADING = re.compile(r"^\d+(?:\.\d+)*\.[ \xa0]\S", re.MULTILINE)
MAX_PER_SOURCE = 3000


class Missing(Exception):
    """No source of a kind is installed; the message names what to install."""


def chinese_poetry_root() -> Path | None:
    """The npm package `chinese-poetry` (its `dist` folder), installed globally, or None."""
    try:
        root = subprocess.run(["npm", "root", "-g"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    dist = Path(root) / "chinese-poetry" / "dist"
    return dist if dist.is_dir() else None


def fortune_entries(name: str) -> list[str]:
    """The entries of a fortune file, ANSI colours removed."""
    path = FORTUNES / name
    if not path.is_file():
        return []
    text = ANSI.sub("", path.read_text(encoding="utf-8"))
    return [entry.strip() for entry in text.split("\n%\n") if entry.strip()]


def poems(dist: Path, pattern: str, title_key: str) -> list[str]:
    """chinese-poetry JSON poems as title, author and one paragraph a line."""
    out = []
    for path in sorted(glob.glob(str(dist / pattern))):
        for poem in json.loads(Path(path).read_text(encoding="utf-8")):
            lines = poem.get("paragraphs") or poem.get("content") or []
            if isinstance(lines, str):
                lines = [lines]
            head = [poem.get(title_key) or poem.get("title") or "", poem.get("author", "")]
            out.append("\n".join([h for h in head if h] + lines))
            if len(out) >= MAX_PER_SOURCE:
                return out
    return out


def chapters(path: Path) -> list[str]:
    """chinese-poetry prose books: one chapter (its paragraphs, a line each) a document."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):  # Guwen Guanzhi: volumes of essays
        data = [essay for volume in data["content"] for essay in volume["content"]]
    return ["\n".join([item.get("chapter", ""), *item["paragraphs"]]) for item in data]


def sections(path: Path) -> list[str]:
    """A gzipped plain-text manual cut at its numbered headings; sections of fewer than 200 characters dropped."""
    if not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        text = f.read()
    starts = [m.start() for m in HEADING.finditer(text)]
    pieces = [text[a:b].strip() for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    return [p for p in pieces if len(p) >= 200]


def source_files(pattern: str, limit: int) -> list[str]:
    out = []
    for path in sorted(glob.glob(pattern, recursive=True)):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            out.append(text)
        if len(out) >= limit:
            break
    return out


def _zh_verse() -> list[str]:
    docs = fortune_entries("tang300") + fortune_entries("song100")
    if dist := chinese_poetry_root():
        docs += poems(dist, "songci/ci.song.*.json", "rhythmic")
        docs += poems(dist, "quantangshi/poet.tang.*.json", "title")
        docs += poems(dist, "shijing/*.json", "title") + poems(dist, "chuci/*.json", "title")
        docs += poems(dist, "yuanqu/*.json", "title")
    if not docs:
        raise Missing("no Chinese verse: apt-get install fortunes-zh (and npm install -g chinese-poetry)")
    return docs


def _zh_classical() -> list[str]:
    docs = [e for e in fortune_entries("chinese") if "《道德经》" in e]
    if dist := chinese_poetry_root():
        for name in ("lunyu/lunyu.json", "sishuwujing/mengzi.json", "mengxue/guwenguanzhi.json"):
            docs += chapters(dist / name)
    if len(docs) < 100:
        raise Missing("no classical Chinese prose: npm install -g chinese-poetry")
    return docs


def _zh_prose() -> list[str]:
    docs = sections(REFERENCE / "debian-reference.zh-cn.txt.gz") + sections(FAQ / "debian-faq.zh-cn.txt.gz")
    if not docs:
        raise Missing("no modern Chinese prose: apt-get install debian-reference-zh-cn debian-faq-zh-cn")
    return docs


def _en_prose() -> list[str]:
    docs = sections(REFERENCE / "debian-reference.en.txt.gz") + sections(FAQ / "debian-faq.en.txt.gz")
    if not docs:
        raise Missing("no English prose: apt-get install debian-reference-en debian-faq")
    return docs


def _python() -> list[str]:
    return source_files(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), MAX_PER_SOURCE)


def _c() -> list[str]:
    docs = source_files("/usr/include/**/*.h", MAX_PER_SOURCE) + source_files("/usr/include/**/*.c", 500)
    if not docs:
        raise Missing("no C headers: apt-get install libc6-dev")
    return docs


def documents(kind: str) -> list[str]:
    """The unique documents of a kind (first copy kept), in a fixed order; Missing when none is installed."""
    make = {
        "zh_verse": _zh_verse,
        "zh_classical": _zh_classical,
        "zh_prose": _zh_prose,
        "en_prose": _en_prose,
        "python": _python,
        "c": _c,
    }[kind]
    return list(dict.fromkeys(d for d in make() if d.strip()))
