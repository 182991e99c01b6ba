"""Async HTTP client and wire schema for the GenRM judge service."""

from importlib.metadata import version as _version

__version__ = _version("genrm-client")
