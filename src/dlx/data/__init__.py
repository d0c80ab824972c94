"""Data: corpus → token shards (`prepare`), the shard format (`shards`), and the batch sources (`source`: one protocol
for one dataset (`loader`), several by weight (`mixture`) and generated tokens (`synthetic`))."""

SYNTHETIC = "synthetic"
"""The `data.path` that means generated tokens instead of a prepared dataset (benchmarks, tests)."""
