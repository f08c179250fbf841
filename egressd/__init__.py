"""egressd: a fleet of egress proxies as Kubernetes objects, probed and leased over HTTP."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("egressd")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
