"""Async HTTP client and wire schema for the GenRM judge service.

A reward author installs only this package (``pip install genrm-client``: httpx, pydantic and
pydantic-settings) and writes::

    from genrm_client import get_genrm_client

    text = await get_genrm_client().generate(
        [{"role": "user", "content": "..."}], {"temperature": 0.2}, route_key="safety"
    )
"""

from importlib.metadata import version as _version

from genrm_client._client import (
    NOT_GIVEN,
    AsyncGenRMClient,
    GenRMClient,
    MessageLike,
    NotGiven,
    RequestLike,
    SamplingParamsLike,
    SyncGenRMClient,
    close_genrm_clients,
    get_genrm_client,
)
from genrm_client._exceptions import (
    GenRMConnectionError,
    GenRMError,
    GenRMHTTPError,
    GenRMOverloadedError,
    GenRMTimeoutError,
    UnknownRouteKeyError,
)
from genrm_client._settings import ClientSettings
from genrm_client.types import (
    DEFAULT_ROUTE_KEY,
    GenerateMeta,
    GenerateRequest,
    GenerateResponse,
    HealthReport,
    Message,
    SamplingParams,
)

__version__ = _version("genrm-client")

__all__ = [
    "DEFAULT_ROUTE_KEY",
    "NOT_GIVEN",
    "AsyncGenRMClient",
    "ClientSettings",
    "GenRMClient",
    "GenRMConnectionError",
    "GenRMError",
    "GenRMHTTPError",
    "GenRMOverloadedError",
    "GenRMTimeoutError",
    "GenerateMeta",
    "GenerateRequest",
    "GenerateResponse",
    "HealthReport",
    "Message",
    "MessageLike",
    "NotGiven",
    "RequestLike",
    "SamplingParams",
    "SamplingParamsLike",
    "SyncGenRMClient",
    "UnknownRouteKeyError",
    "__version__",
    "close_genrm_clients",
    "get_genrm_client",
]
