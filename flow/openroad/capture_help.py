"""Record the real OpenROAD's `help` for every command the stage scripts use.

    .venv/bin/python -m flow.openroad.capture_help /path/to/openroad

writes flow/openroad/openroad-help.txt: a header naming the OpenROAD version,
then each command's help text as OpenROAD prints it.  commands.py reads the
options of its table from that file, so the static checks (`moekda pnr
--check`, flow/tests) check the scripts against what the real tool declares,
not against a table typed from its sources.  Run it again after moving to a
new OpenROAD and commit the file with the script changes it calls for.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HELP_FILE = Path(__file__).resolve().parent / "openroad-help.txt"
MARK = "#### "   # starts each command's section in the help file


def capture(openroad: str, names: list[str]) -> str:
    script = ["puts \"#### version [ord::openroad_version]\""]
    for name in names:
        script.append(f'puts "{MARK}{name}"; if {{[catch {{help {name}}}]}} {{ puts "(no help)" }}')
    script.append("exit")
    with tempfile.NamedTemporaryFile("w", suffix=".tcl", delete=False) as f:
        f.write("\n".join(script) + "\n")
    out = subprocess.run([openroad, "-no_init", "-exit", f.name], capture_output=True, text=True,
                         timeout=120)
    Path(f.name).unlink()
    if out.returncode != 0:
        raise SystemExit(f"capture_help: {openroad} failed: {out.stderr.strip()[-300:]}")
    text = out.stdout[out.stdout.index("#### version"):]
    return ("# `help <command>` of the real OpenROAD, for flow/openroad/commands.py.\n"
            "# Written by `python -m flow.openroad.capture_help OPENROAD`; do not edit.\n" + text)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    from flow.openroad.commands import HELP_COMMANDS
    HELP_FILE.write_text(capture(argv[0], sorted(HELP_COMMANDS)))
    print(f"wrote {HELP_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
