"""`dlx-torchrun` (or `python -m dlx.cli.torchrun`): torchrun, with the exit status a scheduler expects after a stop.

torchrun takes the same options and starts the same ranks. What differs is the end of a job stopped by a signal:

- SIGTERM (or SIGINT, SIGHUP) to torchrun alone, as Kubernetes sends it to the container's first process: torchrun
  sends it on to the ranks, which finish their step and save a checkpoint (dlx.train.build.signals), and waits for them
  at most `--shutdown-timeout` seconds (torchrun's option, default 30, also `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`) before
  SIGKILL. torchrun itself then exits 1 with its traceback; this exits 128 + the signal's number (143 for SIGTERM)
  with one line.
- SIGTERM to torchrun and every rank at once, as Slurm's `--signal` and its end-of-job kill do: the same.
- Every rank stopped by a signal before torchrun got one (a rank's exit status 130 or 143, torchrun's
  ChildFailedError): the ranks' status, with one line.
- Every rank stopped on a bad input (exit status 2; rank 0 printed the line, per attempt under `--max-restarts`):
  exit 2 with one line, not torchrun's report of a failed child.

Any other failure is torchrun's own (its error report and exit status).
"""

from __future__ import annotations

import os
import signal
import sys

USER_ERROR = 2
"""A rank's exit status after a bad input (dlx.errors.UserError), printed in one line by rank 0."""
STOP_STATUSES = {128 + signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGHUP}


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(run_torchrun)(sys.argv[1:] if argv is None else argv)  # record: torchrun's report of a failure


def run_torchrun(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    try:
        run(args)
    except SignalException as e:
        timeout = args.shutdown_timeout or int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
        print(
            f"dlx-torchrun: {signal.Signals(e.sigval).name} received: the ranks were asked to stop after their step "
            f"and save a checkpoint, with {timeout} s before SIGKILL (--shutdown-timeout); exit {128 + e.sigval}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        statuses = {failure.exitcode for failure in e.failures.values()}
        if statuses == {USER_ERROR}:
            print("dlx-torchrun: the ranks stopped on the error printed above (exit 2)", file=sys.stderr, flush=True)
            return USER_ERROR
        if len(statuses) != 1 or not statuses <= STOP_STATUSES:
            raise
        status = statuses.pop()
        name = signal.Signals(status - 128).name
        print(f"dlx-torchrun: the ranks stopped on {name} (after a checkpoint); exit {status}", file=sys.stderr)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
