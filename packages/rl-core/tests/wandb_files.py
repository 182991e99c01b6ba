"""Reading an offline W&B run back from its files, as ``wandb sync`` would upload it.

An offline run is a folder ``wandb/offline-run-<time>-<id>/`` holding ``run-<id>.wandb``: a log
of protobuf ``Record`` messages in W&B's block format (a 7-byte file header ``:W&B`` + magic +
version, then 32 KiB blocks of records, each with a 7-byte header: CRC-32, length, type — full,
or first / middle / last part of one split across blocks). Only the tests read it.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HEADER = 7
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def offline_runs(folder: Path, *, timeout_s: float = 60.0) -> list[Path]:
    """The offline run folders under ``folder`` (``wandb/offline-run-*``), oldest first, each
    complete: W&B's service may still be writing a run's file when ``finish`` returns, so this
    waits (up to ``timeout_s``) for each file's closing ``exit`` record."""
    runs = sorted((folder / "wandb").glob("offline-run-*"))
    deadline = time.monotonic() + timeout_s
    for run in runs:
        while not any(r.WhichOneof("record_type") == "exit" for r in records(run)):
            assert time.monotonic() < deadline, f"{run}: no exit record after {timeout_s} s"
            time.sleep(0.2)
    return runs


def records(run_folder: Path) -> Iterator[Any]:
    """The ``Record`` messages of an offline run, in order."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_folder.glob("run-*.wandb")
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:_HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, f"{path}: not a W&B run file"
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        pending = chunk if kind in (_FULL, _FIRST) else pending + chunk
        if kind in (_FIRST, _MIDDLE):
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending)
        pending = b""
        yield record


def history(run_folder: Path) -> dict[int, dict[str, Any]]:
    """``{step: {key: value}}`` of everything the run logged (values decoded from JSON; the
    rows of one step merged; a media value such as a table is a dict of its fields)."""
    out: dict[int, dict[str, Any]] = {}
    for record in records(run_folder):
        if record.WhichOneof("record_type") != "history":
            continue
        row = out.setdefault(record.history.step.num, {})
        for item in record.history.item:
            value = json.loads(item.value_json)
            if item.key:
                row[item.key] = value
                continue
            *parents, last = item.nested_key
            place = row
            for name in parents:
                place = place.setdefault(name, {})
            place[last] = value
    return out


def run_info(run_folder: Path) -> Any:
    """The run's ``RunRecord`` (project, group, display name, config)."""
    for record in records(run_folder):
        if record.WhichOneof("record_type") == "run":
            return record.run
    raise AssertionError(f"{run_folder}: no run record")


def summary(run_folder: Path) -> dict[str, Any]:
    """The run's summary as last written."""
    out: dict[str, Any] = {}
    for record in records(run_folder):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def table_rows(run_folder: Path, logged: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a table logged as ``logged`` (its history value: a ``table-file``)."""
    assert logged["_type"] == "table-file", logged
    table = json.loads((run_folder / "files" / logged["path"]).read_text())
    return [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
