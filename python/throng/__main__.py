"""The ``throng`` command, installed with the package (a console script): the command line of
the ``throng`` binary, run inside this interpreter. ``python -m throng`` runs it too."""

import signal
import sys

from . import _throng


def main():
    """Runs ``throng`` over this process's arguments and exits with its status."""
    # As the binary: a Ctrl-C ends a command that does not catch it (`throng run` catches it
    # itself, and pauses the run), where Python's own handler would only set a flag that
    # throng's code never reads.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_throng.main(["throng", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
