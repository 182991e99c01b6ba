"""``--use-wandb``: the run's records in a Weights & Biases run, as slime, verl and OpenRLHF log.

The run's files stay the record (``metrics.jsonl``, ``samples/``, the PNG curves); W&B is one
more view of them, like TensorBoard. :class:`WandbMirror` is handed each line of ``metrics.jsonl``
and each step's sample rows as they were written (``rl_core.metrics.MetricsWriter``), and the
curves once drawn:

* every metric of ``metrics.jsonl`` under its own name, at its step (the x-axis ``step``; the
  ``time`` key is W&B's own ``_timestamp``);
* each training step's samples as a table ``samples`` (step, sample, question, response, reward,
  status, source, judge reply, math-verify's view, the watch's flags);
* the curves (``reward.png``, ``accuracy.png``, ``length.png``) as images ``curves/<name>``, and
  the watch's warning lines in the run's summary.

wandb is an optional extra (``genrm-rl-core[wandb]``): :func:`require_wandb` refuses
``--use-wandb`` without it before anything starts. ``--wandb-mode offline`` needs no network and
no account: the run is written under ``--wandb-dir`` (default: the run directory), and
``wandb sync`` uploads it later.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_core.config import TrainConfig

__all__ = [
    "SAMPLE_COLUMNS",
    "WANDB_EXTRA",
    "WandbMirror",
    "WandbNotInstalledError",
    "WandbStartError",
    "judge_reply",
    "require_wandb",
]

logger = logging.getLogger(__name__)

WANDB_EXTRA = "genrm-rl-core[wandb]"
#: The columns of the ``samples`` table, one row per sample of a training step.
SAMPLE_COLUMNS = (
    "step",
    "sample",
    "question",
    "label",
    "response",
    "reward",
    "status",
    "source",
    "judge reply",
    "math-verify",
    "in loss",
    "flags",
)


class WandbNotInstalledError(ImportError):
    """``--use-wandb`` without the ``wandb`` extra installed."""


class WandbStartError(RuntimeError):
    """``wandb.init`` failed (no API key for an online run, an unreachable host, ...)."""


def require_wandb() -> str:
    """Check wandb is importable; returns its version, or raises naming the extra."""
    try:
        import wandb
    except ImportError as err:
        raise WandbNotInstalledError(
            f"--use-wandb needs wandb, which is not installed ({err}); install the extra: "
            f"pip install '{WANDB_EXTRA}' (in this workspace: uv sync --group wandb-tests), or "
            "drop --use-wandb (metrics.jsonl and TensorBoard are written either way)"
        ) from err
    return str(wandb.__version__)


def judge_reply(row: dict[str, Any]) -> str | None:
    """What the judge answered for a sample row of ``samples/`` (its verdict text), or None when
    no judge was asked (a rule-gate hit, a rule reward)."""
    details = row.get("details") or {}
    if row.get("source") == "gate":
        return None
    calls = details.get("judge_calls") or []
    replies = [str(c["reply"]) for c in calls if isinstance(c, dict) and "reply" in c]
    if replies:  # the raw replies of every call (a panel, a rubric: one per call)
        return " | ".join(replies)
    reply = details.get("reply", details.get("pred"))
    return None if reply is None else str(reply)


def _row(step: int, row: dict[str, Any]) -> list[Any]:
    details = row.get("details") or {}
    return [
        step,
        f"g{row.get('group')}/{row.get('index')}",
        row.get("question"),
        row.get("label"),
        row.get("response"),
        row.get("reward"),
        row.get("status"),
        row.get("source"),
        judge_reply(row),
        details.get("rule"),
        row.get("in_loss"),
        ",".join(row.get("flags") or []),
    ]


class WandbMirror:
    """One W&B run for one ``rl-core train`` run (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path) -> None:
        require_wandb()
        import wandb

        run_dir = Path(run_dir)
        folder = Path(cfg.wandb_dir).expanduser() if cfg.wandb_dir else run_dir
        folder.mkdir(parents=True, exist_ok=True)
        # silent: no banner in the run's output; console off: W&B leaves stdout / stderr alone
        settings: dict[str, Any] = {"silent": True, "console": "off"}
        if cfg.wandb_host:
            settings["base_url"] = cfg.wandb_host
        try:
            self.run: Any = wandb.init(
                project=cfg.wandb_project or "genrm",
                entity=cfg.wandb_team,
                group=cfg.wandb_group,
                name=cfg.wandb_run_name or run_dir.resolve().name,
                id=cfg.wandb_run_id,
                resume="allow" if cfg.wandb_run_id else None,
                mode=cfg.wandb_mode,
                dir=str(folder),
                config=cfg.model_dump(mode="json", exclude={"layout", "plan"}),
                settings=wandb.Settings(**settings),
            )
        except Exception as err:  # wandb raises its own kinds (UsageError, CommError, ...)
            raise WandbStartError(
                f"--use-wandb: W&B could not start a run (--wandb-mode {cfg.wandb_mode}): {err}; "
                "an online run needs an API key (WANDB_API_KEY or `wandb login`): "
                "--wandb-mode offline needs none and is uploaded later with `wandb sync`"
            ) from err
        self.mode = cfg.wandb_mode
        self._wandb = wandb
        self._last_step = -1
        # every metric is plotted against the run's step, whatever was logged at that step
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    @property
    def where(self) -> str:
        """Where the run lives: its local folder (offline: what ``wandb sync`` takes) or URL."""
        if self.mode == "offline":
            return str(Path(self.run.dir).parent)
        return str(getattr(self.run, "url", None) or Path(self.run.dir).parent)

    def _log(self, step: int, data: dict[str, Any]) -> None:
        if step < self._last_step:  # W&B keeps a run's steps increasing; the files have them all
            logger.warning(
                "W&B: step %d logged after step %d is dropped there", step, self._last_step
            )
            return
        self._last_step = step
        self.run.log({"step": step, **data}, step=step)

    def log(self, step: int, record: dict[str, Any]) -> None:
        """One line of ``metrics.jsonl``: every metric under its own name (None left out)."""
        data = {k: v for k, v in record.items() if k not in ("step", "time") and v is not None}
        self._log(step, data)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """One step's samples as the ``samples`` table."""
        table = self._wandb.Table(
            columns=list(SAMPLE_COLUMNS), data=[_row(step, row) for row in rows]
        )
        self._log(step, {"samples": table})

    def log_figures(self, paths: Sequence[Path]) -> None:
        """The run's curves (``rl-core plot``'s PNGs), at the last step."""
        images = {f"curves/{p.stem}": self._wandb.Image(str(p)) for p in paths if p.is_file()}
        if images:
            self._log(max(self._last_step, 0), images)

    def log_summary(self, values: dict[str, Any]) -> None:
        """Values for the run's summary (the watch's warning lines, the final evaluation)."""
        for key, value in values.items():
            self.run.summary[key] = value

    def finish(self, exit_code: int = 0) -> None:
        """Close the run (offline: its files are complete, ready for ``wandb sync``)."""
        self.run.finish(exit_code=exit_code)
