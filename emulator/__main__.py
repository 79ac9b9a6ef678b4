"""`python -m servewatch.emulator native build|status`: the emulator's own maintenance commands."""

import sys

from servewatch.emulator import native

if __name__ == "__main__":
    # One command group today; native.main prints the usage for anything else.
    sys.exit(native.main(sys.argv[2:] if sys.argv[1:2] == ["native"] else ["--help"]))
