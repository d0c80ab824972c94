"""Data: corpus → token shards (`prepare`), the shard format (`shards`), and the training loader (`loader`)."""

SYNTHETIC = "synthetic"
"""The `data.path` that means generated tokens instead of a prepared dataset (benchmarks, tests)."""
