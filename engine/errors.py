"""The one exception type for bad user input.

Raising `UserError("what is wrong; how to fix it")` anywhere in the engine makes the CLI
print that single line and exit with status 2, without a traceback.
"""


class UserError(Exception):
    """Bad input the user can fix: the message is one line naming the problem and the fix."""
