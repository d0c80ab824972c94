"""`dlx tokenizer extend`: new tokens for a new corpus, appended to an existing tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

tokenizer_app = typer.Typer(help="Work on tokenizers (extend one for continued pretraining).", no_args_is_help=True)


@tokenizer_app.command("extend")
def extend(
    base: Annotated[Path, typer.Argument(help="The base tokenizer.json, or a model folder holding one.")],
    corpus: Annotated[list[str], typer.Argument(help="The new domain's text: files, folders, globs (as prepare).")],
    add: Annotated[int, typer.Option("--add", help="New tokens to learn and append (e.g. 16000).")] = ...,
    out: Annotated[Path, typer.Option("--out", help="Folder to write the extended tokenizer.json into.")] = ...,
    sample_chars: Annotated[
        int, typer.Option(help="Characters of the corpus (its first documents) to learn the merges on.")
    ] = 20_000_000,
    text_field: Annotated[
        str, typer.Option(help="JSON key / Parquet column of the text, as `dlx prepare` (WuDao: content).")
    ] = "text",
) -> None:
    """Learn --add merges on a sample of CORPUS and append them to BASE: every existing id and special token stays
    where it is, new ids follow the last existing one. Prints characters and bytes per token before and after."""
    from dlx.data.tokenizer_extend import extend_tokenizer

    result = extend_tokenizer(base, corpus, add, out, sample_chars, text_field)
    b, a = result.before, result.after
    print(
        f"added {result.added:,} tokens (ids {result.first_new_id:,}-{result.first_new_id + result.added - 1:,}) "
        f"to {result.base_vocab_size:,}; wrote {out}/tokenizer.json"
    )
    print(f"sample of {b.chars:,} characters ({b.bytes:,} bytes):")
    print(f"  before  {b.tokens:>12,} tokens  {b.chars_per_token:.3f} chars/token  {b.bytes_per_token:.3f} bytes/token")
    print(f"  after   {a.tokens:>12,} tokens  {a.chars_per_token:.3f} chars/token  {a.bytes_per_token:.3f} bytes/token")
    print(f"  {a.chars_per_token / b.chars_per_token:.3f}x characters per token")


def register(app: typer.Typer) -> None:
    app.add_typer(tokenizer_app, name="tokenizer")
