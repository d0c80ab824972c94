"""The one exception type that reaches the user as a single line and exit status 2."""


class UserError(Exception):
    """Bad input from the user: a missing file, a wrong config key or value, a corrupt shard.

    The CLI prints `error: <message>` on one line and exits with status 2. The message names the problem and the fix.
    """

    exit_code = 2
