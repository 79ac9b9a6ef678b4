"""servewatch: the one top-level package. Its rooms (`servewatch.pipeline`, `servewatch.store`,
`servewatch.collectors`, ...) are the folders at the top of the source tree, linked below it;
the rest of this folder is the application shell: the `servewatch` CLI (`servewatch.cli`),
configuration, the `run` service and the demo, thin wrappers that no room imports.
"""

from importlib.metadata import PackageNotFoundError as _NotInstalled
from importlib.metadata import version as _version

try:
    __version__ = _version("servewatch")
except _NotInstalled:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
