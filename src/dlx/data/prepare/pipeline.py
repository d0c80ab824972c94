"""`prepare_dataset`: corpus → token shards, once, in parallel, resumable.

The order of a run: validate options, resolve inputs, check --out (finished with the same request: return at once;
resumable: continue; someone else's: UserError) — then, holding a lock on the folder and still writing nothing, scan
the corpus and load or train the tokenizer, so every bad-input error comes before the first byte is written (an --out
folder created for the run is removed again). Then tokenizer.json and a first manifest (complete=False) are written,
and the encode pass fills the shards.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from dlx.atomic import atomic_write_bytes
from dlx.data.pool import InlinePool, WorkerPool, make_pool
from dlx.data.prepare.curation import (
    DROPS_FILE,
    REMOVED_FILE,
    REPORT_FILE,
    VERDICTS_FILE,
    DropIndex,
    audit_trail,
    drops_bytes,
    read_drops,
    report_files,
    verdicts_of,
)
from dlx.data.prepare.encode import encode_corpus, initial_resume_state, spool_dir
from dlx.data.prepare.encoders import choose_encoder, spread
from dlx.data.prepare.inputs import InputList
from dlx.data.prepare.options import PrepareOptions, build_options
from dlx.data.prepare.outdir import TASKS_DIR, existing_dataset, locked, start_dataset
from dlx.data.prepare.progress import PrepareProgress
from dlx.data.prepare.readers import sample_documents
from dlx.data.prepare.scan import CHECK_SAMPLE_CHARS, ScanCounts, ScanRule, scan_corpus
from dlx.data.prepare.tokenizer import TokenizerInfo, describe, read_tokenizer, tokenizer_text, train_bpe
from dlx.data.prepare.units import choose_unit_bytes, plan_units
from dlx.data.prepare.worker import EncodeSetup
from dlx.data.shards import MANIFEST_FILE, TOKENIZER_FILE, Manifest
from dlx.errors import UserError


def prepare_dataset(inputs: list[str] | None, out: str | Path, **options: Any) -> Manifest:
    """`prepare_from_options` with the options of `build_options` (corpus, tokenizer, train_tokenizer, text_field,
    val_fraction, val_documents, shard_tokens, workers, strict, add_bos, progress)."""
    return prepare_from_options(build_options(inputs, **options), Path(out))


def prepare_from_options(opts: PrepareOptions, out: Path) -> Manifest | None:
    """Tokenize a corpus into `out` (see `dlx prepare --help`); returns the finished manifest.

    A second call with the same inputs and options does no work; a call after an interrupted one continues it and
    ends with the same bytes as an uninterrupted run. `workers` (default: all cores) changes the speed, never the
    output. Concurrent calls on one `out` (every rank of a job, say) queue on a lock: the first prepares, the others
    then find the finished dataset. Workers are fresh interpreters (`dlx.data.pool`) that do not import the calling
    script.
    """
    ui = PrepareProgress(opts.progress)
    started = time.monotonic()
    inputs = measure_inputs(opts, ui)
    opts = opts.sized_for(inputs)
    if opts.dry_run:
        dry_run(opts, inputs, out, ui)
        return None
    given = read_tokenizer(opts.tokenizer, opts.add_bos) if opts.tokenizer else None
    opts = opts.with_bos(given)
    request = opts.request(inputs)
    sha = given.sha256 if given else None
    manifest = existing_dataset(out, request, sha)  # read-only: refuse someone else's folder before creating anything
    if (manifest is None or not manifest.complete) and (out / TASKS_DIR).exists():
        raise UserError(
            f"--out {out} holds the parts of a prepare split into tasks; run its missing tasks and "
            f"`dlx prepare --merge --out {out}`, or choose a new --out"
        )
    if manifest is None or not manifest.complete:
        created = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        try:
            with locked(out, ui.note):
                manifest = existing_dataset(out, request, sha)  # again: another run may have finished meanwhile
                if manifest is None or not manifest.complete:
                    manifest = _run(out, inputs, opts, request, given, manifest, ui)
                    ui.note(f"prepared {out}: {totals(manifest)} in {time.monotonic() - started:.1f}s")
                    if warning := small_validation_split(manifest):
                        ui.note(warning)
                    return manifest
        except BaseException:
            if created and out.is_dir() and not any(out.iterdir()):
                out.rmdir()  # bad input found by the scan: leave nothing behind
            raise
    ui.note(f"{out} is already prepared ({totals(manifest)}); nothing to do")
    return manifest


def dry_run(opts: PrepareOptions, inputs: InputList, out: Path, ui: PrepareProgress) -> None:
    """Scan and curate without tokenizing: write only `out`/curation.md and the audit trail (refused where a dataset
    already is)."""
    if (out / MANIFEST_FILE).exists():
        raise UserError(f"--dry-run writes a report only: --out {out} holds a dataset; choose a new --out")
    n_units = sum(1 for _ in plan_units(inputs, choose_unit_bytes(inputs.bytes)))
    with make_pool(min(opts.workers, n_units)) as pool:
        scan = scan_corpus(pool, inputs, choose_unit_bytes(inputs.bytes), opts, ui)
    out.mkdir(parents=True, exist_ok=True)
    removed = audit_trail(scan.removed, scan.duplicates)
    for name, data in report_files(scan.curation, opts.output_request(), None, removed).items():
        atomic_write_bytes(out / name, data)
    ui.note(
        f"dry run: {scan.documents:,} documents kept of those read; the report is {out / REPORT_FILE}, the removed "
        f"documents are listed in {out / REMOVED_FILE}"
    )


def measure_inputs(opts: PrepareOptions, ui: PrepareProgress) -> InputList:
    """The inputs' totals (a first walk over them); UserError for a missing input."""
    inputs = InputList(opts.inputs, opts.corpus).measure()
    if inputs.ignored:
        ui.note(f"note: ignored {inputs.ignored} file(s) in input folders with suffixes prepare does not read")
    return inputs


def _run(
    out: Path,
    inputs: InputList,
    opts: PrepareOptions,
    request: dict,
    given: TokenizerInfo | None,
    manifest: Manifest | None,
    ui: PrepareProgress,
) -> Manifest:
    """Under the lock: a fresh start (scan, tokenizer, first writes) unless resuming, then the encode pass."""
    n_units = sum(1 for _ in plan_units(inputs, choose_unit_bytes(inputs.bytes)))
    with make_pool(min(opts.workers, n_units)) as pool:
        fresh = None
        if manifest is None:
            fresh = _scan_and_tokenize(pool, inputs, opts, given, ui)
            manifest = _write_start(out, opts, request, *fresh)
        return _encode(pool, out, inputs, manifest, opts, ui, fresh)


def _scan_and_tokenize(
    pool: InlinePool | WorkerPool,
    inputs: InputList,
    opts: PrepareOptions,
    given: TokenizerInfo | None,
    ui: PrepareProgress,
) -> tuple[ScanCounts, TokenizerInfo]:
    """The read-only first half of a fresh run: scan, report bad input, load or train the tokenizer."""
    scan = scan_corpus(pool, inputs, choose_unit_bytes(inputs.bytes), opts, ui, verdicts=opts.curate.active)
    if scan.bad:
        ui.note(f"warning: skipped {scan.bad} bad record(s) (--strict makes them fatal); the first:")
        for example in scan.bad_examples:
            ui.note(f"  {example}")
    if given is not None:
        return scan, given
    kept = " that curation kept" if opts.curate.active else ""
    ui.note(
        f"training a {opts.train_vocab_size}-token byte-level BPE on {sum(map(len, scan.sample)) / 1e6:.1f}M "
        f"characters of the documents{kept}"
    )
    tok = train_bpe(scan.sample, opts.train_vocab_size)
    info = describe(tok, tok.to_str(pretty=True), opts.add_bos, None, "(trained)")
    if info.vocab_size < opts.train_vocab_size:
        ui.note(f"note: the corpus only supports {info.vocab_size} tokens (asked for {opts.train_vocab_size})")
    return scan, info


def _write_start(out: Path, opts: PrepareOptions, request: dict, scan: ScanCounts, tok: TokenizerInfo) -> Manifest:
    """The first writes of a fresh run: tokenizer.json, then a manifest with no shards and the resume state."""
    source = {
        "inputs": opts.inputs_record(),
        "request": request,
        "scan": scan.record(),
        "resume": initial_resume_state(choose_unit_bytes(request["bytes"])),
    }
    extra = work = None
    if opts.curate.active:  # the encode pass follows the scan's per-document decisions instead of redoing them
        extra = report_files(scan.curation, request, scan.drops, audit_trail(scan.removed, scan.duplicates))
        work = {VERDICTS_FILE: drops_bytes(verdicts_of(scan.verdicts))}
    return start_dataset(out, source, tok.json_text, tok.sha256, tok.vocab_size, tok.eos_id, tok.bos_id, extra, work)


def _encode(
    pool: InlinePool | WorkerPool,
    out: Path,
    inputs: InputList,
    manifest: Manifest,
    opts: PrepareOptions,
    ui: PrepareProgress,
    fresh: tuple[ScanCounts, TokenizerInfo] | None,
) -> Manifest:
    json_text = tokenizer_text(out)
    if hashlib.sha256(json_text.encode("utf-8")).hexdigest() != manifest.tokenizer_sha256:
        raise UserError(f"{out}/{TOKENIZER_FILE} was replaced after prepare started; delete {out} and run again")
    unit_bytes = manifest.source["resume"]["unit_bytes"]
    if fresh:
        sample = fresh[0].sample
    else:  # a resumed run has no scan sample
        sample = sample_documents(plan_units(inputs, unit_bytes), opts.text_field, CHECK_SAMPLE_CHARS)
    encoder, why = choose_encoder(json_text, spread(sample, CHECK_SAMPLE_CHARS))
    ui.note(why)
    setup = EncodeSetup(
        tokenizer_json=json_text,
        encoder=encoder,
        rule=ScanRule.of(opts),
        eos_id=manifest.eos_id,
        bos_id=manifest.bos_id,
        dtype=manifest.dtype,
        spool_dir=spool_dir(out),
        verdicts_file=str(out / VERDICTS_FILE) if opts.curate.active else None,
    )
    drops = DropIndex(read_drops(out) if (out / DROPS_FILE).exists() or opts.curate.dedup else None)
    manifest = encode_corpus(pool, out, inputs, manifest, setup, opts.shard_tokens, ui, drops)
    (out / VERDICTS_FILE).unlink(missing_ok=True)  # needed by the encode pass only
    return manifest


def totals(m: Manifest) -> str:
    s, val = m.summary(), m.summary()["splits"]["val"]
    return (
        f"{s['tokens']:,} tokens in {s['shards']} {m.dtype} shards, {s['documents']:,} documents "
        f"(val: {val['documents']:,} documents, {val['tokens']:,} tokens)"
    )


SMALL_VAL_TOKENS = 2 * 8 * 1024
"""Fewer validation tokens than 2 batches of 8 × 1,024: an evaluation on them is noisy, worth a warning."""


def small_validation_split(m: Manifest) -> str | None:
    """A warning line when the validation split is not empty but smaller than SMALL_VAL_TOKENS."""
    val = m.summary()["splits"]["val"]
    if not 0 < val["tokens"] < SMALL_VAL_TOKENS:
        return None
    return (
        f"warning: the validation split holds {val['documents']:,} document(s), {val['tokens']:,} tokens: fewer than "
        f"2 batches of 8 × 1,024 ({SMALL_VAL_TOKENS:,} tokens), so evaluations on it will be noisy; raise "
        "--val-fraction or give --val-documents"
    )
