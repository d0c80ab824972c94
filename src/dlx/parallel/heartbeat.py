"""Which rank is hung: every rank writes its step and phase to the job's store (`distributed.job_store`) as it goes,
and a thread of each rank writes the time every TICK_S, so that when a collective fails (a peer timed out after
parallel.timeout_s, or died) the ranks still running name the rank(s) that did not arrive, in one line: the ranks whose
time went stale (stopped, dead, or stuck holding the interpreter) or that are at an earlier step or phase, with their
last step, phase and how long ago.

A rank that fails on its own (its own error, not a collective's) tells the others before it leaves the group: it
writes its error to the store and prints it in one line (`announce_failure`), so that the peers, whose collective then
fails, name that rank and its error instead of only "connection closed", and the job's output holds the original error
even when torchrun ends the failing rank before the interpreter prints its traceback. Its own error is never explained
away: a peer only "did not arrive" when its tick went stale, or when it is behind and this rank waited about as long as
a collective's timeout (a live peer one phase behind is the normal state of a job whose rank just raised; under load the
peers' beats lag).

Each beat also re-arms `faulthandler.dump_traceback_later`: a rank that makes no progress for 0.9 × parallel.timeout_s
(just before its collective would time out) prints the Python stack of every thread to its stderr (a rank stuck in a
collective shows where; a stopped or dead rank cannot print, and is the one the line names).

A rank killed outright (SIGKILL, the out-of-memory killer) announces nothing, and its peers' collectives fail at
once with "Connection closed by peer", while its last tick is still fresh. The peers then name the ranks whose process
is gone: a pid no longer alive on this host, or, on another host, a tick that goes stale within STALE_S + TICK_S
(`explain` waits that long for it). A rank that leaves after its own `explain` marks itself (LEFT_KEY) first, so
that with 3 or more ranks the survivors name the killed rank, not a peer that already gave up because of it.

One beat is a small `set` to the store (about 0.1 ms on a local TCPStore), a few per optimizer step.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import json
import os
import socket
import sys
import threading
import time
from typing import Any

import psutil
import torch.distributed as dist

from dlx.errors import UserError

KEY = "heartbeat/rank{}"
ALIVE_KEY = "alive/rank{}"
FAILED_KEY = "failed/rank{}"
LEFT_KEY = "left/rank{}"
PROCESS_KEY = "process/rank{}"
PEER_LOST = ("closed by peer", "connection reset", "broken pipe", "end of file", "connection refused")
"""Words of a collective's error when a peer's connection went away (gloo, NCCL, the TCP store)."""
TICK_S = 1.0
STALE_S = 3.0
READ_TIMEOUT_S = 5.0
DUMP_AT = 0.9
ERROR_CHARS = 300
"""The most of an error's message a line quotes (gloo's run to a few hundred characters)."""
PHASES = ("forward and backward", "loss all-reduce", "between steps")
"""A step's phases in the order a rank passes them; a rank at an earlier (step, phase) is behind."""


class RankLost(UserError):
    """A collective failed because some rank did not arrive (hung, stopped or dead)."""


class Heartbeat:
    """This rank's beats, and the reading of every rank's beat after a failed collective."""

    def __init__(self, store: dist.Store | None, rank: int, world_size: int, timeout_s: float):
        self.store, self.rank, self.world_size, self.timeout_s = store, rank, world_size, timeout_s
        self.host = socket.gethostname()
        self.last: dict[str, Any] = {}
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.active:
            with contextlib.suppress(RuntimeError):
                store.set(PROCESS_KEY.format(rank), json.dumps({"pid": os.getpid(), "host": self.host}))
            self._ticker = threading.Thread(target=self._tick, args=(store.clone(),), daemon=True, name="dlx-alive")
            self._ticker.start()

    def _tick(self, store: dist.Store) -> None:
        """Write this rank's time every TICK_S until closed (a stopped or dead process's time goes stale)."""
        while not self._stop.is_set():
            try:
                store.set(ALIVE_KEY.format(self.rank), repr(time.time()))
            except RuntimeError:  # the store is gone (the job ends)
                return
            self._stop.wait(TICK_S)

    @property
    def active(self) -> bool:
        return self.store is not None and self.world_size > 1

    def beat(self, step: int, phase: str) -> None:
        """Record that this rank reached `phase` of optimizer step `step` (no-op in one process)."""
        if not self.active:
            return
        self.last = {"step": step, "phase": phase, "time": time.time(), "pid": os.getpid(), "host": self.host}
        self.store.set(KEY.format(self.rank), json.dumps(self.last))
        faulthandler.dump_traceback_later(DUMP_AT * self.timeout_s, exit=False, file=sys.stderr)

    def close(self) -> None:
        self._stop.set()
        if self.active:
            faulthandler.cancel_dump_traceback_later()

    def explain(self, error: BaseException) -> BaseException:
        """What to raise for an error in training: RankLost naming the rank that failed first (it announced its error)
        or the ranks this one waited for, or `error` itself where there is no group or nothing to name (this rank's
        own error)."""
        if not self.active or not isinstance(error, RuntimeError):  # collectives fail with RuntimeError
            return error
        self._stop.set()
        self._mark_left()
        beats, alive = self.read_beats()
        mine = f"a collective failed on rank {self.rank} at {where(self.last)}"
        failed = self.read_failures()
        if failed:
            first = sorted(failed, key=lambda rank: failed[rank]["time"])  # the first is the cause, the rest followed
            named = "; then ".join(describe_failure(rank, failed[rank]) for rank in first)
            return RankLost(f"{mine} because {named} (then this rank's collective: {one_line(error)})")
        gone = self.ranks_gone(beats, alive, waits=any(words in str(error).lower() for words in PEER_LOST))
        if gone:
            named = "; ".join(gone)
            return RankLost(f"{mine}: {named} (the collective's error: {one_line(error)})")
        now = time.time()
        waited = now - self.last.get("time", now)
        behind = ranks_behind(beats, alive, self.rank, now, waited >= DUMP_AT * self.timeout_s)
        if not behind or self.rank in behind:  # this rank failed on its own (or is the one behind): its own error
            return error
        named = "; ".join(describe(rank, beats.get(rank), now) for rank in behind)
        return RankLost(
            f"{mine}: {named}; parallel.timeout_s is {self.timeout_s:g} s (stacks of the ranks that waited are on "
            f"their stderr; the collective's error: {one_line(error)})"
        )

    def ranks_gone(
        self, beats: dict[int, dict[str, Any] | None], alive: dict[int, float], waits: bool = True
    ) -> list[str]:
        """Descriptions of the peers whose process ended without a word (killed): on this host, a pid no longer alive;
        on another host, a tick that stopped (`waits`: until every such peer's tick is fresh again or STALE_S old).
        Peers that marked themselves as leaving after their own `explain` are not counted."""
        peers = [rank for rank in range(self.world_size) if rank != self.rank and not self._read(LEFT_KEY.format(rank))]
        processes = {rank: json.loads(self._read(PROCESS_KEY.format(rank)) or "{}") for rank in peers}
        dead = [rank for rank in peers if self._pid_gone(processes[rank])]
        if dead:
            return [describe_gone(rank, beats.get(rank), processes[rank], "its process is gone") for rank in dead]
        remote = [rank for rank in peers if processes[rank].get("host", self.host) != self.host]
        stopped = self._ticks_stopping(remote, alive) if waits else []
        return [describe_gone(rank, beats.get(rank), processes[rank], "its heartbeat stopped") for rank in stopped]

    def _pid_gone(self, process: dict[str, Any]) -> bool:
        if process.get("host") != self.host or "pid" not in process:
            return False
        try:
            return psutil.Process(process["pid"]).status() == psutil.STATUS_ZOMBIE  # killed, not yet reaped
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:  # not ours to read: no judgement
            return False

    def _ticks_stopping(self, ranks: list[int], alive: dict[int, float]) -> list[int]:
        """Of `ranks` (on other hosts), those whose tick stays unchanged for STALE_S (read again every TICK_S)."""
        last = {rank: alive.get(rank, 0.0) for rank in ranks}
        deadline = time.time() + STALE_S + TICK_S
        while ranks and time.time() < deadline:
            stale = [rank for rank in ranks if time.time() - last[rank] > STALE_S]
            if len(stale) == len(ranks):
                break
            time.sleep(TICK_S / 2)
            for rank in ranks:
                tick = self._read(ALIVE_KEY.format(rank))
                last[rank] = float(tick) if tick else last[rank]
        return [rank for rank in ranks if time.time() - last[rank] > STALE_S]

    def _mark_left(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.store.set_timeout(datetime.timedelta(seconds=READ_TIMEOUT_S))
            self.store.set(LEFT_KEY.format(self.rank), repr(time.time()))

    def announce_failure(self, error: BaseException) -> None:
        """This rank failed on its own: write its error to the store for the peers' `explain`, and print it in one
        line now, before the group is destroyed (the peers' collectives then fail, they exit, and torchrun may end
        this rank before its traceback is printed at exit)."""
        if not self.active:
            return
        failure = {**self.last, "error": one_line(error), "time": time.time(), "pid": os.getpid(), "host": self.host}
        with contextlib.suppress(RuntimeError):  # the store is gone: the line below still names the error
            self.store.set_timeout(datetime.timedelta(seconds=READ_TIMEOUT_S))
            self.store.set(FAILED_KEY.format(self.rank), json.dumps(failure))
        print(f"error: {describe_failure(self.rank, failure)} (its traceback follows)", file=sys.stderr, flush=True)

    def read_failures(self) -> dict[int, dict[str, Any]]:
        """The failures other ranks announced, by rank."""
        failed = {}
        for rank in range(self.world_size):
            text = self._read(FAILED_KEY.format(rank)) if rank != self.rank else None
            if text:
                failed[rank] = json.loads(text)
        return failed

    def read_beats(self) -> tuple[dict[int, dict[str, Any] | None], dict[int, float]]:
        """Every rank's last beat and last tick (None / absent: never written, or the store did not answer within
        READ_TIMEOUT_S)."""
        self.store.set_timeout(datetime.timedelta(seconds=READ_TIMEOUT_S))
        beats: dict[int, dict[str, Any] | None] = {}
        alive: dict[int, float] = {}
        for rank in range(self.world_size):
            beat, tick = self._read(KEY.format(rank)), self._read(ALIVE_KEY.format(rank))
            beats[rank] = json.loads(beat) if beat else None
            if tick:
                alive[rank] = float(tick)
        return beats, alive

    def _read(self, key: str) -> str | None:
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except RuntimeError:
            return None


def position(beat: dict[str, Any] | None) -> tuple[int, int]:
    if beat is None:
        return (-1, -1)
    phase = beat.get("phase")
    return (int(beat.get("step", -1)), PHASES.index(phase) if phase in PHASES else -1)


def ranks_behind(
    beats: dict[int, dict[str, Any] | None], alive: dict[int, float], me: int, now: float, timed_out: bool = True
) -> list[int]:
    """The ranks whose tick is older than STALE_S (stopped, dead, or stuck holding the interpreter); when every rank
    ticks and this rank waited as long as a collective's timeout (`timed_out`), the ranks at an earlier (step, phase)
    than the furthest one (hung while live, e.g. in a slow save). Without a timeout, a live rank one phase behind is
    no sign of a hang: a rank that just raised its own error is usually one phase ahead of its peers."""
    stale = [rank for rank in beats if rank != me and now - alive.get(rank, 0.0) > STALE_S]
    if stale or not timed_out:
        return stale
    furthest = max(position(b) for b in beats.values())
    return [rank for rank, beat in beats.items() if position(beat) < furthest]


def describe(rank: int, beat: dict[str, Any] | None, now: float) -> str:
    if beat is None:
        return f"rank {rank} did not arrive (no heartbeat: it never reached step 1)"
    return (
        f"rank {rank} did not arrive (last heartbeat {now - beat['time']:.0f} s ago at step {beat['step']}, "
        f"{beat['phase']}; pid {beat['pid']} on {beat['host']})"
    )


def describe_gone(rank: int, beat: dict[str, Any] | None, process: dict[str, Any], how: str) -> str:
    """`rank R failed: its process is gone (killed, e.g. SIGKILL or out of memory) after step S, phase (pid P on H)`"""
    last = where(beat or {})
    return (
        f"rank {rank} failed: {how} (killed: SIGKILL, the out-of-memory killer or its node lost) at {last} "
        f"(pid {process.get('pid', '?')} on {process.get('host', '?')})"
    )


def describe_failure(rank: int, failure: dict[str, Any]) -> str:
    return f"rank {rank} failed at {where(failure)}: {failure['error']} (pid {failure['pid']} on {failure['host']})"


def where(beat: dict[str, Any]) -> str:
    return f"step {beat['step']}, {beat['phase']}" if "step" in beat else "start-up (before step 1)"


def one_line(error: BaseException) -> str:
    """`Type: message`, on one line and at most ERROR_CHARS long."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"
