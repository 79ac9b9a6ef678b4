"""`python -m servewatch.collectors.traces native build|status`: the compiled OTLP decoder."""

from __future__ import annotations

import sys

from servewatch.collectors.traces import otlp_native

USAGE = "usage: python -m servewatch.collectors.traces native build|status\n"

if __name__ == "__main__":
    if sys.argv[1:2] != ["native"]:
        sys.stderr.write(USAGE)
        sys.exit(2)
    sys.exit(otlp_native.main(sys.argv[2:]))
