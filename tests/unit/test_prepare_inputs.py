"""Every input format, read back from the shards: decode(encode(document)) == document, in input order."""

from __future__ import annotations

import gzip
import json
import os
import random
import tracemalloc
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from dlx.data.prepare import prepare_dataset, readers
from dlx.data.prepare.inputs import InputFile, InputList, file_kind
from dlx.data.prepare.readers import BadRecord, read_file, read_unit
from dlx.data.prepare.units import plan_units
from dlx.errors import UserError
from prepare_helpers import all_documents, decoded_documents, make_documents, tiny_tokenizer, write_jsonl

__all__ = ["tiny_tokenizer"]  # the fixture, imported for its name


def _input(path, kind=None) -> InputFile:
    kind, compression = (kind, None) if kind else file_kind(str(path), explicit=True)
    return InputFile(str(path), path.stat().st_size, path.stat().st_mtime_ns, kind, compression)


def _texts(items) -> list[str]:
    return [i for i in items if isinstance(i, str)]


def _make_every_format(root) -> tuple[list[str], list[str]]:
    """One input of each kind; returns (inputs, the documents they hold in order)."""
    docs = make_documents(60, seed=1)
    chunks = [docs[i : i + 6] for i in range(0, 60, 6)]
    (root / "a.txt").write_text(chunks[0][0])
    write_jsonl(root / "b.jsonl", chunks[1])
    (root / "c.json").write_text("\n".join(json.dumps({"text": d}) for d in chunks[2]) + "\n")  # JSON lines
    (root / "d.json").write_text(json.dumps([{"text": d, "n": i} for i, d in enumerate(chunks[3])], indent=1))
    with gzip.open(root / "e.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in chunks[4])
    (root / "f.jsonl.zst").write_bytes(
        zstandard.compress("".join(json.dumps({"text": d}) + "\n" for d in chunks[5]).encode())
    )
    (root / "g.txt.gz").write_bytes(gzip.compress(chunks[6][0].encode()))
    (root / "h.txt.zst").write_bytes(zstandard.compress(chunks[6][1].encode()))
    pq.write_table(pa.table({"text": chunks[7], "id": list(range(6))}), root / "i.parquet", row_group_size=2)
    tree = root / "tree"
    for i, (name, doc) in enumerate(zip(["x.py", "y.c", "sub/z.java"], chunks[8][:3], strict=True)):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(doc)
        (tree / f".hidden{i}.py").write_text("not read")
    (tree / "image.png").write_bytes(b"\x89PNG not read")
    (tree / ".git").mkdir()
    (tree / ".git" / "config.py").write_text("not read")
    (root / "glob").mkdir()
    for i, d in enumerate(chunks[9][:2]):
        write_jsonl(root / "glob" / f"part{i}.jsonl", [d])
    inputs = [
        *(
            str(root / n)
            for n in [
                "a.txt",
                "b.jsonl",
                "c.json",
                "d.json",
                "e.jsonl.gz",
                "f.jsonl.zst",
                "g.txt.gz",
                "h.txt.zst",
                "i.parquet",
                "tree",
            ]
        ),
        str(root / "glob" / "*.jsonl"),
    ]
    tree_docs = chunks[8][:3]  # a folder's files before its subfolders': x.py, y.c, sub/z.java
    expected = [
        chunks[0][0],
        *chunks[1],
        *chunks[2],
        *chunks[3],
        *chunks[4],
        *chunks[5],
        chunks[6][0],
        chunks[6][1],
        *chunks[7],
        *tree_docs,
        *chunks[9][:2],
    ]
    return inputs, expected


def test_every_format_round_trips_through_the_shards(tmp_path, tiny_tokenizer):
    inputs, expected = _make_every_format(tmp_path)
    out = tmp_path / "out"
    manifest = prepare_dataset(
        inputs, out, tokenizer=tiny_tokenizer, shard_tokens=700, workers=1, progress=False, val_documents=5
    )
    assert manifest.complete and len(manifest.shards) > 3
    val = decoded_documents(out, "val")
    assert len(val) == 5 and set(val) <= set(expected)
    assert decoded_documents(out, "train") == [d for d in expected if d not in set(val)]
    assert manifest.source["scan"]["bad_records"] == 0
    assert sorted(all_documents(out)) == sorted(expected)


def test_wudao_json_array_with_content_field(tmp_path, tiny_tokenizer):
    docs = make_documents(20, seed=2)
    records = [
        {"id": i, "uniqueKey": f"k{i}", "titleUkey": "t", "dataType": "博客", "title": "标题", "content": d}
        for i, d in enumerate(docs)
    ]
    (tmp_path / "part-2021.json").write_text(json.dumps(records, ensure_ascii=False))
    out = tmp_path / "out"
    prepare_dataset(
        [str(tmp_path / "part-2021.json")],
        out,
        tokenizer=tiny_tokenizer,
        text_field="content",
        val_fraction=0.0,
        workers=1,
        progress=False,
    )
    assert decoded_documents(out) == docs


def test_json_array_streams_in_small_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "READ_CHUNK", 7)  # every element straddles many reads
    docs = ["x" * 50, "", "中文" * 9, "a\nb", "1e5"]
    path = tmp_path / "a.json"
    elements = [
        f'{{"text": "{docs[0]}"}} ',
        ' {"text": ""}',
        f'\n{{"text":"{docs[2]}"}}',
        '{"text":"a\\nb"}',
        '{"text":"1e5"}\n',
    ]
    path.write_text(" \n [ " + ",".join(elements) + "]\n")
    assert _texts(read_file(_input(path), "text")) == docs


def test_jsonl_byte_ranges_read_each_line_exactly_once(tmp_path):
    docs = make_documents(200, seed=3)
    path = write_jsonl(tmp_path / "big.jsonl", docs)
    f = _input(path)
    for unit_bytes in (97, 1000, 4096, f.size + 1):
        units = list(plan_units([f], unit_bytes))
        assert [t for u in units for t in _texts(read_unit(u, "text"))] == docs, unit_bytes


def test_units_group_small_files_and_split_large_jsonl(tmp_path):
    small = [write_jsonl(tmp_path / f"s{i}.jsonl", ["x" * 100]) for i in range(10)]
    big = write_jsonl(tmp_path / "big.jsonl", ["y" * 100] * 100)
    files = [_input(p) for p in [*small, big]]
    units = list(plan_units(files, 1000))
    assert [u.index for u in units] == list(range(len(units)))
    assert sum(u.nbytes for u in units) == sum(f.size for f in files)
    assert sum(u.files_completed for u in units) == len(files)
    assert all(u.end is None for u in units if u.files[0].path != str(big))
    assert len([u for u in units if u.end is not None]) > 5


def test_bad_records_are_reported_with_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"text": "ok"}\n{"text": broken\n{"other": 1}\n\xff\xfe\n[1, 2]\n{"text": null}\n{"text": "ok2"}\n'
    )
    items = list(read_file(_input(path), "text"))
    assert _texts(items) == ["ok", "ok2"]
    bad = [i for i in items if isinstance(i, BadRecord)]
    assert [(b.line, b.reason.split(":")[0].split(" (")[0]) for b in bad] == [
        (2, "malformed JSON"),
        (3, "no 'text' field"),
        (4, "invalid UTF-8 at byte 0 of the line"),
        (5, "not a JSON object"),
        (6, "'text' is not a string"),
    ]
    assert bad[0].where() == f"{path}:2"
    (tmp_path / "latin1.txt").write_bytes("line\ncafé".encode("latin-1"))
    [bad_txt] = read_file(_input(tmp_path / "latin1.txt"), "text")
    assert bad_txt.where() == f"{tmp_path / 'latin1.txt'}:2" and "invalid UTF-8" in bad_txt.reason


def test_byte_range_bad_records_report_the_true_line(tmp_path):
    path = tmp_path / "big.jsonl"
    lines = [json.dumps({"text": f"doc {i}"}) for i in range(300)]
    lines[250] = "{oops"
    path.write_text("\n".join(lines) + "\n")
    units = list(plan_units([_input(path)], 1000))
    bad = [i for u in units for i in read_unit(u, "text") if isinstance(i, BadRecord)]
    assert [b.where() for b in bad] == [f"{path}:251"]


def test_corrupt_and_unreadable_files_are_one_bad_record(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b'{"text": "one"}\n' * 3)[:-12])
    items = list(read_file(_input(tmp_path / "a.jsonl.gz"), "text"))
    assert isinstance(items[-1], BadRecord) and "unreadable" in items[-1].reason
    gone = InputFile(str(tmp_path / "missing.txt"), 1, 0, "text")
    [bad] = read_file(gone, "text")
    assert bad.line == 0 and "unreadable" in bad.reason
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "p.parquet")
    [bad] = read_file(_input(tmp_path / "p.parquet"), "text")
    assert "no 'text' column" in bad.reason


def test_input_list_orders_dedupes_and_filters(tmp_path):
    (tmp_path / "b").mkdir()
    for name in ["b/2.jsonl", "b/1.py", "b/skip.bin", "a.txt"]:
        (tmp_path / name).write_text("x")
    inputs = InputList((str(tmp_path / "b"), str(tmp_path / "a.txt"), str(tmp_path / "b" / "1.py"))).measure()
    assert [f.path.removeprefix(str(tmp_path)) for f in inputs] == ["/b/1.py", "/b/2.jsonl", "/a.txt"]
    assert (inputs.files, inputs.ignored) == (3, 1)
    assert file_kind("x.JSONL.ZST", False) == ("jsonl", "zst") and file_kind("x.unknown", False) is None


@pytest.mark.parametrize("spec", ["missing.jsonl", "nothing/*.jsonl"])
def test_missing_inputs_are_user_errors(tmp_path, spec):
    with pytest.raises(UserError, match="input"):
        InputList((str(tmp_path / spec),)).measure()


def _frames(data: bytes, frame_bytes: int, content_size: bool = True) -> list[bytes]:
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    return [compressor.compress(data[i : i + frame_bytes]) for i in range(0, len(data), frame_bytes)]


def _skippable(magic: int, payload: bytes) -> bytes:
    return magic.to_bytes(4, "little") + len(payload).to_bytes(4, "little") + payload


def _bgzf(data: bytes, member_bytes: int) -> bytes:
    """BGZF as `bgzip` writes it: gzip members of at most member_bytes, each header holding the member's size, and
    the empty end-of-file member."""
    members = []
    for chunk in [data[i : i + member_bytes] for i in range(0, len(data), member_bytes)] + [b""]:
        deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
        body = deflate.compress(chunk) + deflate.flush()
        size = (18 + len(body) + 8 - 1).to_bytes(2, "little")
        header = b"\x1f\x8b\x08\x04\0\0\0\0\0\xff\x06\0BC\x02\0" + size
        members.append(header + body + zlib.crc32(chunk).to_bytes(4, "little") + len(chunk).to_bytes(4, "little"))
    return b"".join(members)


def _compressed_layouts(data: bytes) -> dict[str, tuple[str, bytes, bool]]:
    """The same data compressed in each layout: (suffix, bytes, whether it can be cut into pieces)."""
    plain = _frames(data, 700)
    unsized = _frames(data, 700, content_size=False)
    seek_table = b"".join(len(f).to_bytes(4, "little") + (0).to_bytes(4, "little") for f in unsized)
    footer = len(unsized).to_bytes(4, "little") + b"\0" + (0x8F92EAB1).to_bytes(4, "little")
    pzstd = b"".join(_skippable(0x184D2A50, len(f).to_bytes(4, "little")) + f for f in plain)
    return {
        "zstd frames one after another": (".zst", b"".join(plain), True),
        "pzstd (a skippable frame with each frame's size)": (".zst", pzstd, True),
        "zstd seekable format": (".zst", b"".join(unsized) + _skippable(0x184D2A5E, seek_table + footer), True),
        "an empty frame in the middle": (".zst", b"".join([*plain[:3], zstandard.compress(b""), *plain[3:]]), True),
        "zstd frames without sizes or seek table": (".zst", b"".join(unsized), False),
        "one zstd frame": (".zst", zstandard.compress(data), False),
        "BGZF members": (".gz", _bgzf(data, 700), True),
        "gzip members without sizes": (
            ".gz",
            b"".join(gzip.compress(data[i : i + 700]) for i in range(0, len(data), 700)),
            False,
        ),
    }


def test_multi_frame_compressed_jsonl_is_cut_into_units_and_each_line_read_once(tmp_path):
    docs = [f"doc {i} " + random.Random(i).randbytes(i * 37 % 250).hex() for i in range(120)]
    docs[50] = "long " + random.Random(0).randbytes(1500).hex()  # a line longer than several frames
    data = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    for name, (suffix, raw, cuttable) in _compressed_layouts(data).items():
        path = tmp_path / f"big.jsonl{suffix}"
        path.write_bytes(raw)
        units = list(plan_units([_input(path)], 1000))
        assert (len(units) > 3) == cuttable, (name, len(units))
        assert sum(u.nbytes for u in units) == path.stat().st_size and units[-1].files_completed == 1
        assert [t for u in units for t in _texts(read_unit(u, "text"))] == docs, name


def test_zst_frame_units_report_bad_lines_by_frame_and_line(tmp_path):
    lines = [json.dumps({"text": f"doc {i} " + random.Random(i).randbytes(40).hex()}) for i in range(100)]
    lines[70] = "{oops"
    path = tmp_path / "big.jsonl.zst"
    path.write_bytes(b"".join(_frames(("\n".join(lines) + "\n").encode(), 1000)))
    units = list(plan_units([_input(path)], 2000))
    bad = [(u.start, i) for u in units for i in read_unit(u, "text") if isinstance(i, BadRecord)]
    [(start, record)] = bad
    assert start > 0 and record.where().startswith(f"{path}:zstd frames from byte {start}, line ")
    rest = zstandard.ZstdDecompressor().stream_reader(path.read_bytes()[start:], read_across_frames=True).read()
    assert rest.split(b"\n")[record.line - 1] == b"{oops"


def test_parquet_is_cut_by_row_groups_and_rows_keep_their_numbers(tmp_path):
    texts = [f"row {i} " + "w" * 200 for i in range(300)]
    texts[157] = None
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": texts, "n": list(range(300))}), path, row_group_size=25, compression="none")
    units = list(plan_units([_input(path)], 8000))
    assert len(units) > 4 and sum(u.nbytes for u in units) == path.stat().st_size
    items = [i for u in units for i in read_unit(u, "text")]
    assert _texts(items) == [t for t in texts if t is not None]
    [bad] = [i for i in items if isinstance(i, BadRecord)]
    assert bad.where() == f"{path}:row 158" and "not a string" in bad.reason
    pq.write_table(pa.table({"body": texts[:100]}), path, row_group_size=10, compression="none")
    reports = [i for u in plan_units([_input(path)], 2000) for i in read_unit(u, "text")]
    assert [b.reason.split(" (")[0] for b in reports] == ["no 'text' column"], "one report, not one per piece"


def test_many_small_files_are_streamed_not_listed(tmp_path):
    for folder in range(80):
        (tmp_path / f"d{folder:02d}").mkdir()
        for i in range(100):
            (tmp_path / f"d{folder:02d}" / f"{i:03d}.txt").write_text(f"document {folder} {i}")
    inputs = InputList((str(tmp_path),)).measure()
    listed = list(inputs)
    assert inputs.files == len(listed) == 8000 and sum(f.size for f in listed) == inputs.bytes
    tracemalloc.start()
    try:
        units = [len(u.files) for u in plan_units(inputs, 64 << 10)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    tracemalloc.start()
    try:
        held = list(inputs)
        as_list = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert units == [1024] * 7 + [832] and held == listed, "small files grouped, at most 1,024 to a unit"
    assert peak < as_list / 2, f"planning held {peak:,} bytes at peak; the file list alone takes {as_list:,}"


def test_overlapping_inputs_read_each_file_once_in_first_seen_order(tmp_path):
    (tmp_path / "c" / "sub").mkdir(parents=True)
    for name in ["c/1.txt", "c/sub/2.txt", "c/3.jsonl", "other.txt"]:
        (tmp_path / name).write_text("x")
    specs = (str(tmp_path / "c" / "sub" / "2.txt"), str(tmp_path / "c"), str(tmp_path / "**" / "*.txt"))
    paths = [f.path.removeprefix(str(tmp_path)) for f in InputList(specs).measure()]
    assert paths == ["/c/sub/2.txt", "/c/1.txt", "/c/3.jsonl", "/other.txt"]
    recursive = InputList((str(tmp_path / "*"),)).measure()  # matches the folder c and, inside the walk, its files
    assert [f.path.removeprefix(str(tmp_path)) for f in recursive] == [
        "/c/1.txt",
        "/c/3.jsonl",
        "/c/sub/2.txt",
        "/other.txt",
    ]
    inputs = InputList((str(tmp_path / "other.txt"),)).measure()
    (tmp_path / "other.txt").write_text("changed")
    os.utime(tmp_path / "other.txt", ns=(1, 1))
    with pytest.raises(UserError, match="changed while prepare ran"):
        list(inputs)
