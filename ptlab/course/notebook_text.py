"""Text a notebook shows from a command or a script's output, made the same on every machine."""
from __future__ import annotations

import re
import sys


def shown_command(command: list[str], env: dict[str, str] | None = None) -> str:
    """A command as text for a notebook: 'python' for this interpreter, PORT for the free port picked.

    `env` holds the variables set for the command; they are shown before it, as a shell would take them
    (`PTLAB_DEVICE=cpu python -m ...`).
    """
    text = " ".join(["python", *command[1:]]) if command and command[0] == sys.executable else " ".join(command)
    prefix = "".join(f"{name}={value} " for name, value in (env or {}).items())
    return prefix + re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)


def mask_figures(text: str) -> str:
    """Mark every decimal figure in a script's output as measured ('≈0.8123'), so a notebook can show it."""
    return re.sub(r"(?<![\w.≈])(\d+\.\d+)", r"≈\1", text)
