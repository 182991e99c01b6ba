"""The process-wide client keeps working across event loops (the original design's failure)."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

import pytest

from genrm_client import AsyncGenRMClient, close_genrm_clients, get_genrm_client

if TYPE_CHECKING:
    from conftest import StandIn

MSG = [{"role": "user", "content": "hi"}]


def test_singleton_survives_a_second_asyncio_run(
    server: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENRM_URL", server.url)

    async def call() -> tuple[AsyncGenRMClient, str]:
        client = get_genrm_client()
        # Two calls per loop, so the second reuses a pooled keep-alive connection of this loop.
        await client.generate(MSG)
        return client, await client.generate(MSG)

    first, text1 = asyncio.run(call())
    second, text2 = asyncio.run(call())  # a closed transport from loop 1 would fail here
    assert first is second and first.base_url == server.url
    assert text1 == text2 == "echo:hi"
    assert server.hits["/generate"] == 4


def test_module_level_client_works_in_threads_with_their_own_loops(server: StandIn) -> None:
    client = AsyncGenRMClient(server.url)  # created outside any loop, like a module global
    results: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(asyncio.run(client.generate(MSG)))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == [] and results == ["echo:hi"] * 4


def test_close_genrm_clients_gives_fresh_ones(
    server: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENRM_URL", server.url)

    async def use_then_close() -> AsyncGenRMClient:
        client = get_genrm_client()
        await client.generate(MSG)
        await close_genrm_clients()
        assert client.is_closed
        return client

    old = asyncio.run(use_then_close())
    new = get_genrm_client()
    assert new is not old and not new.is_closed
    assert asyncio.run(new.generate(MSG)) == "echo:hi"
