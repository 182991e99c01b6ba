"""A batch cut into engine calls that keep each prefix key's requests together.

A batch (``/generate_batch``) goes out in calls of at most one engine batch
(``max_batch_size``), each routed on its own. With prefix keys, a GRPO group cut over two calls
could land on two engines and pay its shared prefix twice: so the requests of one key stay in
one chunk, and keys with the same home engine share chunks, each chunk led by a key whose home
is where the router sends it (``policy.choose_engine`` routes a chunk by its first request's
key). Pure: the keys and the engines' health in, indices out.
"""

from __future__ import annotations

from collections.abc import Sequence

from genrm_serve.router.policy import EngineLoad, serving_home

__all__ = ["chunk_by_key"]


def chunk_by_key(
    keys: Sequence[str | None], engines: Sequence[EngineLoad], max_batch: int
) -> list[list[int]]:
    """The requests (their indices; ``keys[i]`` is request ``i``'s prefix key) cut into engine
    calls of at most ``max_batch``.

    Without prefix keys: in order. With them: the requests of one key stay in one chunk (unless
    more than a chunk holds), and keys with the same home engine share chunks, a chunk led by a
    key's requests, so that each chunk's key routes it to that home. Requests without a key come
    last, in order.
    """
    step = max_batch
    if all(key is None for key in keys):
        return [list(range(i, min(i + step, len(keys)))) for i in range(0, len(keys), step)]
    by_key: dict[str, list[int]] = {}
    loose: list[int] = []
    for i, key in enumerate(keys):
        if key is None:
            loose.append(i)
        else:
            by_key.setdefault(key, []).append(i)
    order = {e.engine_id: k for k, e in enumerate(engines)}
    homes: dict[str, int] = {}
    for key in by_key:
        home = serving_home(key, engines)
        homes[key] = order[home.engine_id] if home is not None else -1
    chunks: list[list[int]] = []
    current: list[int] = []
    current_home = -1
    for key in sorted(by_key, key=homes.__getitem__):  # stable: first-seen order within
        members = by_key[key]
        if current and (homes[key] != current_home or len(current) + len(members) > step):
            chunks.append(current)
            current = []
        current_home = homes[key]
        while len(members) > step:
            chunks.append(members[:step])
            members = members[step:]
        current.extend(members)
    if current:
        chunks.append(current)
    return chunks + [loose[i : i + step] for i in range(0, len(loose), step)]
