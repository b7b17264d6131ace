"""The `kreg` command that pip puts on PATH: runs the kreg program of this
package's prefix (kreg/bin/kreg in pip's install, bin/kreg of an install
prefix or a build tree), which finds its library, plugins, worker and
tables relative to itself, with this process's arguments."""
import os
import sys

from ._kreg import install_prefix


def main():
    program = os.path.join(install_prefix(), "bin", "kreg")
    try:
        os.execv(program, [program] + sys.argv[1:])
    except OSError as e:
        sys.exit(f"kreg: cannot run {program}: {e.strerror}")
