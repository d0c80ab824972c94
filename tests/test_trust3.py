"""Trust, round 3: a killed rank is named by its peers, and the other items of this round that need no model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch.distributed as dist

from dlx.parallel.heartbeat import PROCESS_KEY, Heartbeat, RankLost

CLOSED = "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40123"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_sigkilled_rank_is_named_by_every_survivor(world_size):
    """The last rank is SIGKILLed mid-step: its tick is still fresh when the survivors' collectives fail at once with
    "Connection closed by peer", and it announced nothing. Each survivor names it (its pid is gone on this host), not
    its own error, and with 3 ranks the second survivor does not name the first, which left after its own explain."""
    store = dist.HashStore()
    ranks = [Heartbeat(store, rank, world_size, timeout_s=600.0) for rank in range(world_size)]
    killed = world_size - 1
    try:
        for heartbeat in ranks:
            heartbeat.beat(4, "forward and backward")
        process = json.loads(store.get(PROCESS_KEY.format(killed)))
        store.set(PROCESS_KEY.format(killed), json.dumps({**process, "pid": dead_pid()}))
        for survivor in ranks[:killed]:
            lost = survivor.explain(RuntimeError(CLOSED))
            assert isinstance(lost, RankLost), lost
            text = str(lost)
            assert text.startswith(
                f"a collective failed on rank {survivor.rank} at step 4, forward and backward: rank {killed} failed: "
                "its process is gone (killed: SIGKILL, the out-of-memory killer or its node lost) at step 4, forward "
                "and backward (pid "
            )
            assert text.count("rank ") == 2 and text.endswith(f"(the collective's error: RuntimeError: {CLOSED})")
    finally:
        for heartbeat in ranks:
            heartbeat.close()


def test_a_killed_rank_on_another_host_is_named_when_its_heartbeat_stops():
    """On another host the pid cannot be read: the survivor waits (at most STALE_S + TICK_S) for the peer's tick to
    go stale, then names it."""
    store = dist.HashStore()
    ranks = [Heartbeat(store, rank, 2, timeout_s=600.0) for rank in range(2)]
    try:
        ranks[1].beat(2, "loss all-reduce")
        store.set(PROCESS_KEY.format(1), json.dumps({"pid": 4242, "host": "node-b"}))
        ranks[1].close()  # its ticker stops, as a killed process's does
        lost = ranks[0].explain(RuntimeError(CLOSED))
        assert isinstance(lost, RankLost), lost
        assert "rank 1 failed: its heartbeat stopped (killed: " in str(lost)
        assert "at step 2, loss all-reduce (pid 4242 on node-b)" in str(lost)
    finally:
        ranks[0].close()
