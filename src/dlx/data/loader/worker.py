"""The worker process: `python -m dlx.data.loader.worker '<json spec>'`, started by `pool.WorkerPool`.

It builds this rank's batches number `worker_id`, `worker_id + num_workers`, ... into shared slots and announces each
on the ready pipe. It blocks (no polling) on the free pipe when every slot is full. It exits when the trainer closes
the pipes (normal close), when a pipe breaks (the trainer died, however it died), or when its parent changes (checked
once a second while blocked, for the rare case where a forked grandchild of the trainer keeps a pipe end open).
It imports numpy but not torch, so it starts in a fraction of a second and takes little memory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from collections import deque

from dlx.data.loader import channel
from dlx.data.loader.plan import open_plan

LIVENESS_CHECK_S = 1.0


class _TrainerGone(Exception):
    """The trainer closed the loader or died: stop quietly."""


def _next_free_slot(free: deque[int], free_fd: int, parent_pid: int) -> int:
    while not free:
        if not channel.wait_readable(free_fd, LIVENESS_CHECK_S):
            if os.getppid() != parent_pid:
                raise _TrainerGone
            continue
        slots = channel.receive_free(free_fd)
        if not slots:
            raise _TrainerGone
        free.extend(slots)
    return free.popleft()


def _wait_for_close(free_fd: int, parent_pid: int) -> None:
    """A finished pass (loop=False): keep the slots alive until the trainer closes the pipes."""
    while True:
        if channel.wait_readable(free_fd, LIVENESS_CHECK_S):
            if not channel.receive_free(free_fd):
                return
        elif os.getppid() != parent_pid:
            return


def run(spec: dict, parent_pid: int) -> None:
    plan = open_plan(spec)
    slots = channel.SharedSlots(spec["shm_fd"], spec["n_slots"], plan.micro_batch_size, spec["seq_len"])
    free = deque(range(spec["n_slots"]))
    worker_id, num_workers = spec["worker_id"], spec["num_workers"]
    for sequence, cursor in enumerate(plan.schedule(spec["start"], spec["loop"])):
        if sequence % num_workers != worker_id:
            continue
        slot = _next_free_slot(free, spec["free_fd"], parent_pid)
        plan.fill(cursor, slots.views[slot])
        channel.send_ready(spec["ready_fd"], slot, sequence)
    _wait_for_close(spec["free_fd"], parent_pid)


def main() -> int:
    # Ctrl-C reaches the whole process group; the trainer decides what an interrupt means and closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent_pid = os.getppid()
    spec = json.loads(sys.argv[1])
    try:
        run(spec, parent_pid)
    except (_TrainerGone, BrokenPipeError):
        return 0
    except BaseException:
        text = traceback.format_exc()
        try:
            channel.send_error(spec["ready_fd"], text)
        except OSError:  # the trainer is gone too; at least leave the traceback on stderr
            print(text, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
