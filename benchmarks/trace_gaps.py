"""Where a GPU waits for its host: the idle gaps of a profiler trace, and what the host ran then.

A kernel-time table says how long the kernels took, not why the wall time is longer. This reads a
Chrome trace written by ``torch.profiler`` (``prof.export_chrome_trace``; taken with
``with_stack=True`` so that Python frames are in it), merges the intervals of every GPU kernel,
copy and memset into busy time, and charges each idle gap to the Python frames the host was in at
the gap's middle. The frames named are the innermost ones of the project or transformers (the
parts a change here can move)::

    python benchmarks/trace_gaps.py TRACE.json [--top 15] [--min-us 20]
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
#: frames worth naming: this project's code and the model library's, not torch's internals
OWN = ("genrm_serve", "genrm_rl", "transformers/models", "hf_engine.py")


def _events(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _frame(name: str) -> str:
    """A profiler frame's short name: ``.../genrm_serve/engines/hf/engine.py(612): _run_chunk``
    → ``engines/hf/engine.py:_run_chunk``."""
    where, _, func = name.partition(": ")
    file = where.split("(")[0]
    for mark in ("genrm_serve/", "transformers/models/", "benchmarks/"):
        if mark in file:
            file = file.split(mark, 1)[1]
            break
    else:
        file = file.rsplit("/", 1)[-1]
    return f"{file}:{func or where}"


def summarize(path: Path, top: int = 15, min_us: float = 20.0) -> str:
    events = _events(path)
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        return f"{path}: no GPU events"
    busy = _merged(gpu)
    first, last = busy[0][0], busy[-1][1]
    frames = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        if e.get("cat") == "python_function" and any(m in e["name"] for m in OWN)
    )
    starts = [f[0] for f in frames]
    by_frame: dict[str, float] = defaultdict(float)
    gaps: list[tuple[float, float, str]] = []
    for (_, end), (start, _) in itertools.pairwise(busy):
        gap = start - end
        if gap < min_us:
            continue
        mid = (start + end) / 2
        # the innermost project frame that spans the middle of the gap
        inner = None
        hi = bisect.bisect_right(starts, mid)
        for i in range(hi - 1, max(-1, hi - 4000), -1):  # the latest starts hold the innermost
            f = frames[i]
            if f[1] >= mid and (inner is None or f[1] - f[0] < inner[1] - inner[0]):
                inner = f
        name = _frame(inner[2]) if inner else "(no project frame)"
        by_frame[name] += gap
        gaps.append((gap, end, name))
    span = last - first
    busy_us = sum(b - a for a, b in busy)
    host = [e for e in events if e.get("cat") in ("python_function", "cpu_op", "user_annotation")]
    t0 = min((e["ts"] for e in host), default=first)
    t1 = max((e["ts"] + e["dur"] for e in host), default=last)
    lines = [
        f"host before the first kernel {(first - t0) / 1e3:.1f} ms, after the last "
        f"{max(0.0, t1 - last) / 1e3:.1f} ms",
        f"GPU span {span / 1e3:.1f} ms, busy {busy_us / 1e3:.1f} ms, "
        f"idle {(span - busy_us) / 1e3:.1f} ms ({len(gaps)} gaps >= {min_us:.0f} us: "
        f"{sum(g[0] for g in gaps) / 1e3:.1f} ms)",
        "idle by the host frame it waited on:",
    ]
    for name, us in sorted(by_frame.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {us / 1e3:8.2f} ms  {name}")
    lines.append("largest gaps:")
    for gap, at, name in sorted(gaps, reverse=True)[:top]:
        lines.append(f"  {gap / 1e3:8.2f} ms at +{(at - first) / 1e3:.1f} ms  {name}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--min-us", type=float, default=20.0)
    args = ap.parse_args()
    print(summarize(args.trace, args.top, args.min_us))


if __name__ == "__main__":
    main()
