"""The application shell: the `servewatch` CLI, configuration and scheduled jobs.

Thin wrappers over the library packages; nothing imports this package.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("servewatch")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
