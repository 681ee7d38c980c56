# SPDX-License-Identifier: Apache-2.0
"""python -m ecx ARGS: the ecx command line (serve, get, demo, bench, ...).

Runs the CLI program bundled in the package in place of this process, so its
exit status, signals and output are the program's own. The `ecx` script that
pip puts on PATH is this same function.
"""
import os
import sys

from . import cli_path


def main() -> None:
    path = cli_path()
    try:
        os.execv(path, ["ecx", *sys.argv[1:]])
    except OSError as e:
        sys.exit(f"ecx: cannot run {path}: {e.strerror}")


if __name__ == "__main__":
    main()
