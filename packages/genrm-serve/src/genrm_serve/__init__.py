"""GenRM judge service: LLM judges on Ray Serve with route_key routing."""

from importlib.metadata import version as _version

__version__ = _version("genrm-serve")
