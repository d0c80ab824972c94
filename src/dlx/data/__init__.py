"""Data: corpus → token shards (`prepare`), the shard format (`shards`), and the training loader (`loader`)."""
