"""The tasks dlx ships: lm-eval task folders generated from the embedded corpus (the Python standard library), so a
run evaluates on a downstream task with no network.

`dlx_stdlib_next_line`: four-way multiple choice. The context is the first lines of a function of the standard
library (its `def` line and `CONTEXT_LINES` - 1 code lines of its body); the choices are the function's real next
line and three real code lines of other functions, drawn at random among the lines of about the same length
(within `LENGTH_RATIO`), so the length of a choice does not give the answer. Telling them apart takes what a
language model of Python code learns: indentation that follows the block structure above, names defined in the
context (parameters, locals), and which statement plausibly comes next. Chance is 25 %. lm-eval scores each choice
by its log-likelihood after the context (`acc`, and `acc_norm` per byte of the choice) and by that log-likelihood
less the choice's own without the context (`acc_mutual_info`). Only the last is at chance for an untrained model:
the sum over a choice's tokens favours the choice of fewest tokens, and the real next line tokenizes into the fewest
more often than a quarter of the time (the tokenizer is trained on the same code), so `acc` and `acc_norm` start
near 35 % (BENCHMARKS.md, Evals). The functions are part of the stdlib corpus the demo trains on: the task measures
how well the model learned that code, not generalisation to unseen code.

The folder (task YAML + documents as JSON lines) is generated at first use into the user's cache,
`$XDG_CACHE_HOME/dlx/tasks/` (default `~/.cache/dlx/tasks/`), one folder per Python version (the stdlib differs
between versions); the same Python always gives the same documents. It is written atomically.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import re
import sys
from pathlib import Path

from dlx.atomic import atomic_dir
from dlx.data.prepare.inputs import stdlib_folder

STDLIB_NEXT_LINE = "dlx_stdlib_next_line"
SHIPPED_TASKS = (STDLIB_NEXT_LINE,)
TASK_VERSION = 3
DOCUMENTS = 200
CONTEXT_LINES = 8
"""The def line and the body lines before the line to choose."""
CHOICES = 4
LINE_CHARS = (8, 100)
"""A candidate line's length (indentation included), so that no choice is trivially short or long."""
LENGTH_RATIO = 1.2
"""A distractor is at most this many times longer or shorter than the answer (characters, indentation included)."""
SEED = 0
_DEF = re.compile(r"^(\s*)def \w+\(.*\):\s*$")

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
  - metric: acc_mutual_info
    aggregation: mean
    higher_is_better: true
metadata:
  version: {version}
"""


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dlx" / "tasks"


def shipped_task_dir(name: str) -> Path:
    """The folder of shipped task `name`, generated if it is not there yet."""
    python = f"py{sys.version_info.major}.{sys.version_info.minor}"
    folder = cache_root() / f"{name}-v{TASK_VERSION}-{python}"
    if not (folder / f"{name}.yaml").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with atomic_dir(folder, overwrite=True) as tmp:
            write_next_line_task(tmp, folder)
    return folder


def write_next_line_task(tmp: Path, final: Path, documents: int = DOCUMENTS, seed: int = SEED) -> None:
    """The task YAML and its documents into `tmp`, the YAML naming the data file at `final`."""
    docs = next_line_documents(stdlib_functions(), documents, seed)
    data = final / f"{STDLIB_NEXT_LINE}.jsonl"
    (tmp / data.name).write_text("".join(json.dumps(doc) + "\n" for doc in docs), encoding="utf-8")
    yaml = TASK_YAML.format(name=STDLIB_NEXT_LINE, data=json.dumps(str(data)), version=TASK_VERSION)
    (tmp / f"{STDLIB_NEXT_LINE}.yaml").write_text(yaml, encoding="utf-8")


def stdlib_functions() -> list[list[str]]:
    """Every function of the standard library's top-level modules (tests left out) as its first lines, in a fixed
    order: the def line, then body lines (blank lines, comments and docstring lines skipped)."""
    functions = []
    for path in sorted(stdlib_folder().glob("*.py")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for index, line in enumerate(lines):
            match = _DEF.match(line)
            if match:
                body = _body_lines(lines[index + 1 : index + 40], len(match.group(1)))
                if len(body) >= CONTEXT_LINES:
                    functions.append([line, *body[:CONTEXT_LINES]])
    return functions


def _body_lines(lines: list[str], def_indent: int) -> list[str]:
    """Code lines of a body: deeper than its def, no blank, comment or docstring line, at most LINE_CHARS long."""
    body, in_docstring = [], False
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped and indent <= def_indent:
            break
        quotes = stripped.count('"""') + stripped.count("'''")
        if in_docstring or stripped.startswith(('"""', "'''", 'r"""')):
            in_docstring = (in_docstring + quotes) % 2 == 1 if quotes else True
            continue
        if stripped and not stripped.startswith("#") and LINE_CHARS[0] <= len(line) <= LINE_CHARS[1]:
            body.append(line)
    return body


def next_line_documents(functions: list[list[str]], count: int, seed: int) -> list[dict]:
    """`count` documents {"context", "choices", "label"} from functions drawn without replacement by `seed`; the
    distractors are lines of other functions, of about the answer's length."""
    rng = random.Random(seed)
    pool = sorted({(len(line), line, owner) for owner, lines in enumerate(functions) for line in lines[1:]})
    lengths = [length for length, _, _ in pool]
    docs = []
    for owner in rng.sample(range(len(functions)), min(count * 2, len(functions))):
        lines = functions[owner]
        answer = lines[CONTEXT_LINES]
        low = bisect.bisect_left(lengths, len(answer) / LENGTH_RATIO)
        high = bisect.bisect_right(lengths, len(answer) * LENGTH_RATIO)
        candidates = sorted({line for _, line, other in pool[low:high] if other != owner and line not in lines})
        if len(candidates) < CHOICES - 1:
            continue
        choices = [*rng.sample(candidates, CHOICES - 1), answer]
        rng.shuffle(choices)
        context = "\n".join(lines[:CONTEXT_LINES]) + "\n"
        docs.append({"context": context, "choices": choices, "label": choices.index(answer)})
        if len(docs) == count:
            break
    return docs
