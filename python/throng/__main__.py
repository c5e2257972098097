"""The ``throng`` command, installed with the package (a console script): the command line of
the ``throng`` binary, run inside this interpreter. ``python -m throng`` runs it too.

It knows the scenarios written in Python as well: ``--import MODULE`` (a module or a ``.py``
file, given before the command, repeatable) registers the ``@throng.scenario`` classes of
``MODULE`` (``python -m throng --import ultimatum run ultimatum.toml``); ``report DIR`` and
``run --resume DIR`` import the module the run recorded as defining its scenario."""

import signal
import sys

from . import _throng
from .scenario import import_defining, import_module, registered


def _folder_read(args):
    """The run folder that ``report DIR`` or ``run --resume DIR`` reads, if that is the command."""
    if len(args) >= 2 and args[0] == "report":
        return args[1]
    if args and args[0] == "run":
        for i, a in enumerate(args):
            if a == "--resume" and i + 1 < len(args):
                return args[i + 1]
            if a.startswith("--resume="):
                return a.split("=", 1)[1]
    return None


def main():
    """Runs ``throng`` over this process's arguments and exits with its status."""
    # As the binary: a Ctrl-C ends a command that does not catch it (`throng run` catches it
    # itself, and pauses the run), where Python's own handler would only set a flag that
    # throng's code never reads.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    args = sys.argv[1:]
    while len(args) >= 2 and args[0] == "--import":
        import_module(args[1])
        args = args[2:]
    folder = _folder_read(args)
    if folder is not None:
        import_defining(folder)
    sys.exit(_throng.main(["throng", *args], registered()))


if __name__ == "__main__":
    main()
