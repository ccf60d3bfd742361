"""Where a committed result came from: the command, the commit and the tools.

Every file under bench/results/ says what produced it (the command a reader
can run again and the commit of this repository it ran at, with a flag when
the working tree had changes), so a number can always be traced and redone."""
from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

from moekda.config import REPO_ROOT


def git_commit(root: Path = REPO_ROOT) -> tuple[str, bool]:
    """(HEAD's hash, whether tracked files differ from it); ("unknown", False) outside git."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip() != ""
        return head, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def provenance(command: str, **tools: str) -> dict[str, object]:
    commit, dirty = git_commit()
    return {"command": command, "commit": commit, "working_tree_changed": dirty,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            **{f"{k}_version": v for k, v in tools.items()}}
