"""Requests to a judge service a test deployed, and its ``/metrics`` text read back: what the
service's HTTP tests and its several-replica tests share (a helper module, not a test module,
so that neither test file imports the other)."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from genrm_serve.serve_args import ServeArgs

#: a judge prompt's one user message
USER = {"role": "user", "content": "Is 2+2=4 consistent with 4? Reply 1 or 0."}


def post(args: ServeArgs, path: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{args.url}{path}", json=body, timeout=30.0, **kw)


def get(args: ServeArgs, path: str, **kw: Any) -> httpx.Response:
    return httpx.get(f"{args.url}{path}", timeout=30.0, **kw)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` with exactly ``labels`` in a Prometheus text page."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"no sample {name}{labels} in metrics")
