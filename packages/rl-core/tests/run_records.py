"""Reading what a run recorded, as its users' tools read it: TensorBoard's scalars (shared by
the restart tests)."""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["tb_scalars"]

#: ``SessionLog.START``: the event a writer made with ``purge_step`` opens its file with.
_SESSION_START = 1


def tb_scalars(tb: Path, *, purge: bool = True) -> dict[str, list[tuple[int, float]]]:
    """The scalars TensorBoard shows for the event folder ``tb``, per tag in order: its event
    files read in name order, as TensorBoard's loader reads them, with its rule for a writer
    that goes on after a crash (a ``SessionLog`` START at step N purges every event seen before
    it at step N or later). ``purge=False``: what the files hold, as a reader without that
    rule sees them."""
    from tensorboardX.proto import event_pb2

    seen: list[tuple[str, int, float]] = []
    for path in sorted(tb.glob("*tfevents*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):  # TFRecord: length (8 bytes), its CRC (4), the data, its CRC (4)
            (size,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + size])
            at += 12 + size + 4
            start = event.HasField("session_log") and event.session_log.status == _SESSION_START
            if purge and start:
                seen = [s for s in seen if s[1] < event.step]
            for value in event.summary.value:
                seen.append((value.tag, event.step, value.simple_value))
    out: dict[str, list[tuple[int, float]]] = {}
    for tag, step, value in seen:
        out.setdefault(tag, []).append((step, value))
    return out
