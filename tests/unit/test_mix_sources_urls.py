"""A data.mix (or a stage's mix) of local folders and URLs on paper: each source's key, name, order and folder; the
cache bound shared between the sources in object storage; a source permuted in shard blocks."""

from __future__ import annotations

import numpy as np
import pytest

from dlx.data.loader.cache import share_cache
from dlx.data.loader.shard_blocks import shard_window_bounds
from dlx.data.mixture.order import MixOrder, MixWindows
from dlx.data.mixture.sources import check_mix, dataset_key, mix_sources
from dlx.data.remote import mirror_folder
from dlx.errors import UserError
from dlx.train.build.stages import resolve_stages
from dlx.train.config import build_config


def test_a_url_is_keyed_by_itself_named_by_its_last_part_and_read_from_its_mirror(tmp_path):
    mix = {"s3://bucket/corpora/web/": 1.0, "/data/code": 2.0, "gs://other/zh": 1.0, "hf://datasets/u/notes": 3.0}
    sources = mix_sources(mix, tmp_path)
    assert [s.key for s in sources] == [
        "/data/code",
        "gs://other/zh",
        "hf://datasets/u/notes",
        "s3://bucket/corpora/web",
    ]
    assert [s.name for s in sources] == ["code", "zh", "notes", "web"]  # local folders first, then URLs by key
    assert [s.weight for s in sources] == [2.0, 1.0, 3.0, 1.0]
    assert sources[0].url is None and str(sources[0].path) == "/data/code"
    web = sources[3]
    assert web.url == "s3://bucket/corpora/web"  # without its trailing slash: one dataset however it is written
    assert web.path == mirror_folder("s3://bucket/corpora/web", tmp_path) and web.path.parent == tmp_path
    assert dataset_key("s3://bucket/corpora/web/") == dataset_key("s3://bucket/corpora/web")


def test_names_that_collide_across_folders_and_buckets_are_the_paths_as_written(tmp_path):
    mix = {"/data/web": 1.0, "s3://a/web/": 1.0, "hf://datasets/u/web": 1.0, "gs://b/code": 1.0}
    names = [s.name for s in mix_sources(mix, tmp_path)]
    assert names == ["/data/web", "code", "hf://datasets/u/web", "s3://a/web"]


def test_local_names_and_order_are_as_before_urls():
    sources = mix_sources({"/data/b/web": 1.0, "/data/a/web": 1.0, "/data/a/../zh": 1.0})
    assert [(s.name, str(s.path)) for s in sources] == [
        ("/data/a/web", "/data/a/web"),
        ("/data/b/web", "/data/b/web"),
        ("zh", "/data/a/../zh"),  # ordered by the resolved folder, named by it, the path kept as written
    ]


def test_one_dataset_given_twice_is_refused_in_one_line():
    with pytest.raises(ValueError, match="s3://b/web and s3://b/web/ are the same dataset"):
        check_mix({"s3://b/web": 1.0, "s3://b/web/": 2.0})
    with pytest.raises(UserError) as refused:
        build_config({"data": {"mix": "s3://b/web=1,/data/x=1,s3://b/web/=1"}})
    assert "same dataset" in str(refused.value) and "\n" not in str(refused.value)


def config(mix: dict[str, float], stages: list[dict], path: str | None = None):
    data = {"seq_len": 64, "micro_batch_size": 4, "stages": stages, "cache_dir": "/cache"}
    data.update({"path": path} if path else {"mix": mix})
    return build_config({"model": {"preset": "debug"}, "data": data, "train": {"max_steps": 30}})


def test_a_url_in_a_stage_s_mix_keeps_its_number_name_and_draws_across_stages():
    stages = [{"until": 10}, {"until": 20, "mix": {"s3://b/code": 1.0, "/data/zh": 1.0}}, {"mix": {"s3://b/code/": 1}}]
    plan = resolve_stages(config({"/data/zh": 3.0, "/data/en": 1.0}, stages), 1)
    first, second, third = plan.stages
    assert [s.name for s in first.sources] == ["en", "zh"] and first.source_ids == (0, 1)
    assert [s.name for s in second.sources] == ["zh", "code"] and second.source_ids == (1, 2)
    assert third.source_ids == (2,)  # the same URL, written with a slash: the same source, its number kept
    code = second.sources[1]
    assert code.url == "s3://b/code" and code.path == mirror_folder("s3://b/code", "/cache")
    assert plan.first_draws(1) == (plan.stage_tokens(0)["zh"] // 64, 0)
    assert plan.first_draws(2) == (plan.stage_tokens(1)["code"] // 64,)
    assert plan.spans()[1].reads["mix"] == [["zh", 1.0], ["code", 1.0]]


def test_a_bucket_data_path_and_a_local_folder_of_the_same_name_are_two_sources():
    plan = resolve_stages(config({}, [{"until": 10}, {"mix": {"/data/web": 1.0}}], path="s3://b/web"), 1)
    assert [s.name for s in plan.stages[0].sources] == ["s3://b/web"]
    assert plan.stages[0].sources[0].url == "s3://b/web"
    assert [s.name for s in plan.stages[1].sources] == ["/data/web"]


def test_the_cache_is_shared_so_that_small_splits_keep_all_of_theirs():
    assert share_cache([10, 100, 1000], 300) == [10, 100, 190]  # 10 and 100 fit an equal share: the rest to 1000
    assert share_cache([1000, 10, 500], 300) == [145, 10, 145]  # as given, whatever the order
    assert share_cache([10, 20], 1000) == [10, 20]  # everything fits: each its whole split
    assert share_cache([10, 20], 0) == [0, 0]  # no bound
    assert share_cache([], 100) == []


def test_a_source_larger_than_its_cache_reads_each_window_once_a_pass_in_shard_blocks():
    tokens = [100] * 6  # six shards of 100 tokens, windows of 10: 59 windows
    bounds = shard_window_bounds(tokens, 10, 59)
    order = MixOrder((59, 7), (1.0, 1.0), 2, 1, 0, seed=5, shuffle=True, block_shards=(2, 0), shard_bounds=(bounds, ()))
    assert order.source_order(0) == "shard-blocks-2" and order.source_order(1) == "shuffled"
    for epoch in range(3):
        permutation = order.permutation(0, epoch)
        assert sorted(permutation.tolist()) == list(range(59))
        shards = np.searchsorted(bounds, permutation, side="right") - 1  # the shard each window starts in
        for shard in range(6):  # a block's windows are read together: a shard's lie within a block's 20 draws
            where = np.flatnonzero(shards == shard)
            assert where.max() - where.min() < 20
    rows = MixWindows(order)
    drawn = [w for p in range(0, 236, 2) for s, w in zip(*rows(p), strict=True) if s == 0]
    assert sorted(drawn[:59]) == list(range(59))  # the pass is whole before any window repeats


def test_a_closed_cache_releases_its_folder_and_reports_a_changed_shard_at_the_next_check(tmp_path):
    """A finished stage's cache closes at the boundary: what its batches read is checked then, its folder goes to the
    next cache, and a shard changed before the close stops the next checkpoint (`verify_read`)."""
    import hashlib

    from dlx.data.loader.cache import ShardCache, claim_cache_folder, release_cache_folder
    from dlx.data.shards import ShardInfo

    base = tmp_path / "shards-train-rank0"
    folder = claim_cache_folder(base)
    data = bytes(range(200))
    (folder / "train-00000.bin").write_bytes(data)
    shard = ShardInfo(
        name="train-00000.bin", split="train", tokens=100, documents=1, sha256=hashlib.sha256(data).hexdigest()
    )
    cache = ShardCache("s3://never/contacted", folder, [shard], 2, 1 << 20)  # the shard is there: no download
    cache.start(iter([{shard.name}]), pinned=1)
    cache.acquire(0)
    cache.stop()
    other = claim_cache_folder(base)
    assert other == base.with_name("shards-train-rank0.1")  # held while the cache is open
    release_cache_folder(other)
    (folder / shard.name).write_bytes(bytes(200))  # changed after a batch read it
    cache.close()
    assert claim_cache_folder(base) == folder  # released at the close
    release_cache_folder(folder)
    with pytest.raises(UserError, match=r"shard train-00000\.bin in the cache folder .* changed after it was verified"):
        cache.verify_read()
    assert cache.verify_read() == []  # reported once
