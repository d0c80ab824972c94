"""Parquet input: one row is one document, read a record batch at a time from the text column only."""

from __future__ import annotations

from collections.abc import Iterator

from dlx.data.prepare.readers import BadRecord, Item, NoText, checked_text

BATCH_ROWS = 1024


def read_parquet(path: str, text_field: str) -> Iterator[Item]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        yield BadRecord(path, 0, f"unreadable Parquet file: {e}")
        return
    names = pf.schema_arrow.names
    if text_field not in names:
        yield BadRecord(path, 0, f"no {text_field!r} column (columns: {', '.join(names[:8])})")
        return
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[text_field]):
            for value in batch.column(0).to_pylist():
                row += 1
                try:
                    yield checked_text(value, text_field)
                except NoText as e:
                    yield BadRecord(path, row, str(e), unit="row")
    except (OSError, pa.ArrowException) as e:
        yield BadRecord(path, row + 1, f"unreadable Parquet data: {e}", unit="row")
