"""The one exception type that reaches the user as a single line and exit status 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: a missing file, a wrong config key or value, a corrupt shard.

    The CLI prints `error: <message>` on one line and exits with status 2. The message names the problem and the fix.
    """

    exit_code = 2
    every_rank = False
    """Raised alike on every rank of a job (a decision of rank 0's, a check of shared inputs): under torchrun only rank
    0 prints it (`dlx.cli.app`)."""

    def alike_on_every_rank(self) -> UserError:
        self.every_rank = True
        return self
