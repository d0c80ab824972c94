"""What `bench_curation.py` and `curation_real.py` share: corpora as JSON lines, datatrove's MinHash clusters (its own
four-stage pipeline), and pairs of documents put in one cluster, scored against the planted ones."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import time
from collections import defaultdict
from pathlib import Path


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps({"id": str(i), "text": t}, ensure_ascii=False) + "\n" for i, t in enumerate(texts))
    )
    return path


def pairs_of(cluster_of: dict[int, int]) -> set[tuple[int, int]]:
    """Every pair of documents that share a cluster."""
    members = defaultdict(list)
    for doc, cluster in cluster_of.items():
        members[cluster].append(doc)
    return {p for docs in members.values() for p in itertools.combinations(sorted(docs), 2)}


def datatrove_clusters(corpus: Path, work: Path) -> tuple[dict[int, int], float]:
    """datatrove's MinHash clusters at 5-grams, 14 × 8 (its four stages, 1 task, 1 worker), and the seconds."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    logging.disable(logging.INFO)
    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8)
    w = str(work)
    stages = [
        ([JsonlReader(str(corpus), id_key="id"), MinhashDedupSignature(f"{w}/sigs", config=cfg)], 1),
        ([MinhashDedupBuckets(f"{w}/sigs", f"{w}/buckets", config=cfg)], cfg.num_buckets),
        ([MinhashDedupCluster(f"{w}/buckets", f"{w}/remove", config=cfg, save_cluster_id=True)], 1),
        (
            [
                JsonlReader(str(corpus), id_key="id"),
                MinhashDedupFilter(f"{w}/remove", exclusion_writer=JsonlWriter(f"{w}/removed"), load_cluster_ids=True),
                JsonlWriter(f"{w}/kept"),
            ],
            1,
        ),
    ]
    started = time.perf_counter()
    for i, (pipeline, tasks) in enumerate(stages):
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=1, logging_dir=f"{w}/logs{i}").run()
    seconds = time.perf_counter() - started
    cluster_of = {}
    for path in sorted(Path(w).glob("re*/*.jsonl.gz")) + sorted(Path(w).glob("kept/*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            for line in f:
                doc = json.loads(line)
                cluster = doc["metadata"].get("minhash_cluster_id", -1)
                cluster_of[int(doc["id"])] = -1 - int(doc["id"]) if cluster in (-1, None) else int(cluster)
    return cluster_of, seconds


def scores(found: set, planted: set) -> tuple[float, float]:
    """(recall, precision) of found pairs against planted pairs."""
    hit = len(found & planted)
    return hit / max(len(planted), 1), hit / max(len(found), 1)
