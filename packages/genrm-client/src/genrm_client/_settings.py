"""Client configuration from the environment (``GENRM_*``), so a reward function needs no wiring.

A reward module calls ``get_genrm_client()`` and the deployment decides where the judge is by
setting ``GENRM_URL`` (and ``GENRM_API_KEY`` when the service sits behind an authenticating
proxy). Values passed to a client's constructor win over the environment.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from genrm_client._constants import (
    DEFAULT_BASE_URL,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
)

__all__ = ["ClientSettings", "load_settings"]


class ClientSettings(BaseSettings):
    """Defaults of every client, read from ``GENRM_URL``, ``GENRM_TIMEOUT_S``, ... ."""

    model_config = SettingsConfigDict(env_prefix="GENRM_", frozen=True, extra="ignore")

    url: str = Field(default=DEFAULT_BASE_URL, min_length=1)
    """Base URL of the service, route prefix included (``GENRM_URL``)."""
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    """Total deadline of one call, retries included (``GENRM_TIMEOUT_S``)."""
    max_retries: int = Field(default=DEFAULT_MAX_RETRIES, ge=0)
    """Retries after the first attempt (``GENRM_MAX_RETRIES``)."""
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1)
    """Connection pool size, i.e. the most requests in flight (``GENRM_MAX_CONNECTIONS``)."""
    api_key: SecretStr | None = None
    """Sent as ``Authorization: Bearer <key>`` (``GENRM_API_KEY``); empty means none."""

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        return value


def load_settings() -> ClientSettings:
    """Read the settings, turning a bad ``GENRM_*`` value into an error that names the variable."""
    try:
        return ClientSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"GENRM_{'.'.join(str(p) for p in err['loc']).upper()}={err.get('input')!r}: "
            f"{err['msg']}"
            for err in exc.errors()
        )
        raise ValueError(f"invalid GenRM client setting in the environment: {problems}") from exc
