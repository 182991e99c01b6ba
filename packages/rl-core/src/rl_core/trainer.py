"""The GRPO driver: rollout → rewards → advantages → train → weight sync, step after step.

:meth:`GRPOTrainer.run` is meant to read like the algorithm. Everything it talks to is handed in —
a training backend, rollout engine handles, a phase machine built from the placement plan, reward
functions, the evaluation (``rl_core.evaluation``), the checkpoints (``rl_core.checkpoints``) and
the stop signals (``rl_core.stopping``) — so the same loop runs on a GPU cluster, on this CPU
machine, and in tests with tiny models. Building those parts from flags (Ray, the judge service,
engines) is ``rl_core.launch`` and ``rl_core.services``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rl_core.backends.base import TrainItem
from rl_core.checkpoints import Checkpointer, Resume
from rl_core.config import TrainConfig
from rl_core.data import PromptCursor, PromptDataset
from rl_core.distributed import ForwardGroup, Learner
from rl_core.engine_recovery import engine_restarts
from rl_core.engines import EngineHandle, StaleWeightsError
from rl_core.evaluation import Evaluation
from rl_core.grpo.advantages import Advantages, sample_advantages
from rl_core.judge_audit import panel_agreement, rule_agreement, verdict_source
from rl_core.judge_calls import judge_call_stats
from rl_core.metrics import MemoryProbe, MetricsWriter, PhaseClock, PhaseTimes
from rl_core.pairwise_metrics import pairwise_flips
from rl_core.phases import PhaseMachine
from rl_core.restarts import Restart
from rl_core.rewards import RewardSetup, check_judge_errors, check_scored
from rl_core.rollout import SEED_TRAIN, RolloutSettings, make_group
from rl_core.sample import Sample, accuracy
from rl_core.scoring import RolloutScorer, rollout_settings
from rl_core.stopping import StopRequest
from rl_core.watch import step_watch
from rl_core.weight_sync import ObjectStoreSync, WeightSync

logger = logging.getLogger(__name__)


class NothingToTrainError(RuntimeError):
    """``--max-untrained-steps`` steps in a row had no sample in the loss: the run would go on
    spending rollouts and judge calls without changing a weight."""


@dataclass
class StepRecord:
    """What happened in one step, for the metrics and the closing summary."""

    step: int
    metrics: dict[str, Any]
    phase_times: dict[str, float]
    verdicts: Counter[str] = field(default_factory=Counter)
    #: why the step trained nothing (no sample in the loss), None when it trained
    untrained: str | None = None


def sample_row(s: Sample, flags: Sequence[str] = ()) -> dict[str, Any]:
    """One sample as a JSON record for ``RUN_DIR/samples/`` (``flags``: the reward-hacking
    watch's, ``rl_core.watch``)."""
    return {
        "group": s.group_id,
        "index": s.index,
        "question": s.metadata.get("question"),
        "label": s.label,
        "response": s.response,
        "finish_reason": s.finish_reason,
        "response_tokens": s.response_length,
        "reward": s.reward,
        "status": s.status,
        "source": verdict_source(s),
        "advantage": s.advantage,
        "in_loss": s.in_loss,
        "left_out": s.left_out,
        "weight_version": s.weight_version,
        "details": {k: v for k, v in s.reward_details.items() if k not in ("score", "status")},
        "flags": list(flags),
    }


#: What a step with cut-off responses and nothing to train says after its reason.
CUT_OFF_RULE = (
    "a response cut off at the length limit is judged but kept out of the loss and of its "
    "group's mean / std: raise --rollout-max-response-len, or train on cut-off responses with "
    "--keep-cut-off"
)


def cut_off_advice(batch: Sequence[Sample]) -> str:
    """What to do, after the reason of an untrained step, when cut-off responses were left out
    (empty when none were: a longer limit would not help)."""
    return f"; {CUT_OFF_RULE}" if any(s.left_out == "cut_off" for s in batch) else ""


def untrained_reason(batch: Sequence[Sample], max_response_len: int) -> str | None:
    """Why no sample of ``batch`` is in the loss, in one line; None when some sample is."""
    why = Counter(s.left_out for s in batch)
    if None in why:
        return None
    n = len(batch)
    if not n:
        return "the step has no sample"
    if why["cut_off"] == n:
        return f"all {n} responses hit --rollout-max-response-len {max_response_len}"
    words = {
        "cut_off": f"cut off at --rollout-max-response-len {max_response_len}",
        "judge_error": "with a judge error",
        "judge_timeout": "not judged by --group-judge-deadline-s",
        "no_baseline": "alone in their group after the deadline (no baseline)",
        "aborted": "aborted by the engine",
        "empty": "empty",
        "no_reward": "without a reward",
    }
    parts = ", ".join(f"{k} {words[str(reason)]}" for reason, k in why.most_common())
    return f"none of the {n} samples is in the loss ({parts})"


def train_items(batch: Sequence[Sample]) -> list[TrainItem]:
    """The samples the trainer sees (a sample without response tokens has nothing to train)."""
    return [
        TrainItem(
            tokens=s.tokens,
            response_start=len(s.prompt_tokens),
            advantage=s.advantage,
            in_loss=s.in_loss,
            rollout_logprobs=s.rollout_logprobs or None,
        )
        for s in batch
        if s.response_length > 0
    ]


class GRPOTrainer:
    """One GRPO run: :meth:`run` is the algorithm, top to bottom."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        learner: Learner,
        tokenizer: Any,
        rollout_engines: Sequence[EngineHandle],
        phases: PhaseMachine,
        rewards: RewardSetup,
        train_data: PromptDataset,
        evaluation: Evaluation | None = None,
        checkpoints: Checkpointer | None = None,
        stop: StopRequest | None = None,
        reference: ForwardGroup | None = None,
        actor_fwd: ForwardGroup | None = None,
        overlap: bool = False,
        metrics: MetricsWriter | None = None,
        clock: PhaseClock | None = None,
        weight_sync: WeightSync | None = None,
        memory_probe: MemoryProbe | None = None,
        seeded: bool = True,
        restarts: Sequence[Restart] = (),
    ) -> None:
        self.cfg = cfg
        self.learner = learner
        self.tokenizer = tokenizer
        self.engines = list(rollout_engines)
        self.phases = phases
        self.rewards = rewards
        self.train_data = train_data
        #: what the run evaluates and when (``--eval-*``); without one, the run has no eval set
        self.evaluation = evaluation or Evaluation(cfg, None)
        #: ``--save`` / ``--load``
        self.checkpoints = checkpoints or Checkpointer(cfg, learner)
        #: SIGTERM / SIGINT: stop at the next safe point and save the last completed step
        self.stop = stop or StopRequest()
        #: what the run did on a stop signal, in one line (None: it was not stopped)
        self.stop_report: str | None = None
        self.reference = reference
        self.actor_fwd = actor_fwd
        #: fully-async: step k+1's rollout runs while step k trains (samples ≤ 1 version stale)
        self.overlap = overlap
        self.metrics = metrics or MetricsWriter(cfg.run_dir)
        #: every phase's seconds go through it (the step metrics' ``time/`` and the summary)
        self.clock = clock or PhaseClock()
        #: how weights reach the engines (the plan chooses: CUDA IPC, broadcast, object store)
        self.weight_sync: WeightSync = weight_sync or ObjectStoreSync(learner, self.engines)
        self.memory_probe = memory_probe
        self._memory: dict[str, float] = {}
        self.cursor = PromptCursor(size=len(train_data), seed=cfg.seed)
        if not cfg.rollout_shuffle:
            self.cursor._order = lambda epoch: list(range(len(train_data)))  # type: ignore[method-assign]
        self.weight_version = 0
        self.start_step = 0
        self.history: list[StepRecord] = []
        self.settings = rollout_settings(cfg, seeded=seeded)
        #: steps in a row that trained nothing (no sample in the loss)
        self._untrained_steps = 0
        #: rollout engine re-creations already counted in a step's metrics
        self._restarts_counted = 0
        #: the run's restarts from a checkpoint before this trainer (``rl_core.restarts``); the
        #: last one is told on the first step this trainer records
        self.restarts = list(restarts)
        self._restart_untold = self.restarts[-1] if self.restarts else None

    # --- the loop --------------------------------------------------------------------------------

    async def run(self) -> list[StepRecord]:
        """Train for ``--num-rollout`` steps (from the loaded checkpoint, if any).

        Each step: generate and score → advantages → train → weights to the rollout engines.
        In fully-async the next step's rollout is started before this step trains. On a stop
        signal the step still in rollout is abandoned, a step that trains is finished, and the
        last completed step is saved (with ``--save``).
        """
        resume = await self.checkpoints.load()
        if resume is not None:
            await self.resume(resume)
        steps = range(self.start_step, self.cfg.num_rollout)
        # a resume's checkpoint step was logged (its evaluation too, where one was due) by the
        # run that saved it: it is not evaluated, nor recorded, a second time
        if self.evaluation.before_training and steps and not self.metrics.has_step(self.start_step):
            times: PhaseTimes = {}
            with self.clock.timed("eval", times):
                before = await self.evaluate(self.start_step)
            self.metrics.log(self.start_step, {**before, "time/eval": times["eval"]})
        ahead: asyncio.Task[tuple[list[Sample], PhaseTimes]] | None = None
        self.stop.graceful = True  # a signal now stops at a safe point (and saves)
        try:
            for step in steps:
                if self.stop.requested:
                    break
                await self.phases.enter("inference")
                rolled = await self.stop.unless_stopped(ahead or self.rollout(step))
                ahead = None
                if rolled is None:
                    break  # a stop signal: this step is abandoned, the resume redoes it
                batch, times = rolled
                if self.overlap and step + 1 < self.cfg.num_rollout:
                    ahead = asyncio.ensure_future(self.rollout(step + 1))
                self._check_staleness(batch, max_staleness=1 if self.overlap else 0)
                errors = check_judge_errors(batch, self.cfg.max_judge_error_fraction, step + 1)
                adv = self.advantages(batch)
                await self.record_memory("inference")

                untrained = untrained_reason(batch, self.cfg.rollout_max_response_len)
                if untrained is None:
                    self._untrained_steps = 0
                    train_metrics = await self._train_and_sync(batch, times)
                else:  # nothing to learn from: no optimizer step, the engines keep their weights
                    self._untrained_steps += 1
                    train_metrics = {}
                    logger.warning(
                        "step %d trained nothing (%d of --max-untrained-steps %d in a row): %s%s",
                        step + 1,
                        self._untrained_steps,
                        self.cfg.max_untrained_steps,
                        untrained,
                        cut_off_advice(batch),
                    )
                await self.finish_step(step, batch, adv, errors, train_metrics, times, untrained)
                if untrained is not None and self._untrained_steps >= self.cfg.max_untrained_steps:
                    raise NothingToTrainError(self._nothing_trained(step + 1, batch, untrained))
        except BaseException:
            if ahead is not None:  # a failed step (a lost rank: the run restarts): dropped
                ahead.cancel()
            raise
        if self.stop.requested:
            await self._stopped(ahead)
        else:  # a completed run (a stopped one is resumed, and exported, later)
            await self.checkpoints.save_final_hf()
        self.stop.abrupt()
        self.metrics.close()
        return self.history

    async def _train_and_sync(self, batch: list[Sample], times: PhaseTimes) -> dict[str, float]:
        """The step's optimizer steps, then its weights to the rollout engines."""
        await self.phases.enter("train")
        with self.clock.timed("train", times):
            train_metrics = await self.train(batch)
        await self.record_memory("train")
        with self.clock.timed("wake", times):
            if not self.overlap:
                await self.phases.enter("inference")
        with self.clock.timed("weight_sync", times):
            await self.sync_weights(self.weight_version + 1)
        await self.record_memory("weight_sync")
        return train_metrics

    def _nothing_trained(self, step: int, batch: list[Sample], reason: str) -> str:
        """The error of a run stopped by ``--max-untrained-steps``: the steps, why, what to do."""
        n, limit = self._untrained_steps, self.cfg.max_untrained_steps
        if n == 1:
            text = f"step {step}: no sample was in the loss (--max-untrained-steps {limit}): "
        else:
            text = (
                f"steps {step - n + 1}-{step}: no sample was in the loss, {n} steps in a row "
                f"(--max-untrained-steps {limit}); step {step}: "
            )
        return text + reason + cut_off_advice(batch)

    async def resume(self, resume: Resume) -> None:
        """Go on from a loaded checkpoint: its data position and step; what the run directory
        recorded beyond its step (metrics, samples, TensorBoard) is cut, so the steps redone
        are not recorded twice; the engines take its weights."""
        self.cursor.restore(resume.cursor)
        self.start_step = resume.step
        self.metrics.truncate(self.start_step)
        if self.phases.current not in (None, "inference"):
            await self.phases.enter("inference")  # engines take weights awake
        await self.sync_weights(resume.weight_version)
        logger.info("resumed from %s at step %d", resume.path, self.start_step)

    async def _stopped(self, ahead: asyncio.Task[Any] | None) -> None:
        """A stop signal ended the loop: a rollout started ahead (fully-async) is dropped, the
        last completed step saved, and what was saved said in :attr:`stop_report`."""
        if ahead is not None:
            ahead.cancel()
            with contextlib.suppress(BaseException):
                await ahead
        done = self.history[-1].step if self.history else self.start_step
        where = f"stopped by {self.stop.name} after step {done} of {self.cfg.num_rollout}"
        self.stop_report = await self.checkpoints.save_on_stop(where, done, self._state())

    def _state(self) -> dict[str, Any]:
        """What a checkpoint keeps beside the weights: the data position, the weight version."""
        return {"cursor": self.cursor.state(), "weight_version": self.weight_version}

    # --- the parts of a step ---------------------------------------------------------------------

    async def rollout(self, step: int) -> tuple[list[Sample], PhaseTimes]:
        """Generate the step's groups and score every sample (inline as groups finish, or the
        whole batch after rollout in defer mode)."""
        cfg = self.cfg
        idx = self.cursor.take(cfg.rollout_batch_size)
        groups = [
            make_group(self.train_data.records[i], gid, cfg.n_samples_per_prompt)
            for gid, i in enumerate(idx)
        ]
        times: PhaseTimes = {}
        batch = await self._generate_and_score(
            groups, self.settings, seed_key=(SEED_TRAIN, step), label="rollout", times=times
        )
        check_scored(batch)
        return batch, times

    def advantages(self, batch: list[Sample]) -> Advantages:
        """GRPO advantages over the samples in the loss (``rl_core.grpo.advantages``)."""
        return sample_advantages(batch, normalize_std=self.cfg.grpo_std_normalization)

    async def train(self, batch: list[Sample]) -> dict[str, float]:
        """Log-probs from the forward-only roles where the plan has them, then the optimizer
        steps of this rollout on the learner (one per global batch)."""
        items = train_items(batch)
        size = self.cfg.train_batch_size
        old = ref = None
        if self.actor_fwd is not None and len(items) > size:
            old = await self.actor_fwd.logprobs(items)
        if self.reference is not None and self.cfg.use_kl_loss and self.cfg.kl_loss_coef:
            ref = await self.reference.logprobs(items)
        return await self.learner.train(items, size, old=old, ref=ref)

    async def sync_weights(self, version: int) -> None:
        """Send the policy's weights to every rollout engine; each must then serve ``version``.

        The path is the plan's (``rl_core.weight_sync``); the forward-only ``actor_fwd`` ranks
        of fully-async follow through the object store.
        """
        if version <= self.weight_version and self.weight_version:
            raise StaleWeightsError(
                f"weight version must increase: {version} after {self.weight_version}"
            )
        extra = []
        if self.actor_fwd is not None:
            extra.append(self._sync_actor_fwd())
        await asyncio.gather(self.weight_sync.sync(version), *extra)
        self.weight_version = version

    async def _sync_actor_fwd(self) -> None:
        assert self.actor_fwd is not None
        await self.actor_fwd.load_weights(await self.learner.export_weights())

    def _take_engine_restarts(self) -> int:
        """Rollout engines re-created since the last step's metrics (``engine_recovery``)."""
        total = engine_restarts(self.engines)
        new, self._restarts_counted = total - self._restarts_counted, total
        return new

    async def record_memory(self, phase: str) -> None:
        """GPU memory at the end of ``phase`` (every GPU of the run), for this step's metrics."""
        if self.memory_probe is None:
            return
        for gpu, used in (await self.memory_probe()).items():
            self._memory[f"mem/{phase}/{gpu}_used_gb"] = used

    async def finish_step(
        self,
        step: int,
        batch: list[Sample],
        adv: Advantages,
        errors: int,
        train_metrics: dict[str, float],
        times: PhaseTimes,
        untrained: str | None = None,
    ) -> None:
        """Metrics, evaluation, checkpoint and sample dump of a step (``untrained``: why it
        trained nothing, when it did not)."""
        metrics = self._rollout_metrics(batch)
        metrics.update({f"train/{k}": v for k, v in train_metrics.items()})
        metrics["train/untrained"] = 0 if untrained is None else 1
        restarts = self._take_engine_restarts()
        if untrained is not None:
            metrics["train/untrained_reason"] = untrained
        metrics.update(
            {
                "adv/nonzero": sum(1 for a in adv.values if a != 0.0),
                "adv/abs_mean": statistics.fmean(abs(a) for a in adv.values),
                "adv/degenerate_groups": adv.num_degenerate_groups,
                "adv/groups": adv.num_groups,
                "rollout/judge_errors": errors,
                # rollout engines re-created during the step (their requests were sent again)
                "rollout/engine_restarts": restarts,
                "weights/version": self.weight_version,
            }
        )
        sources = [verdict_source(s) for s in batch]
        verdicts = Counter(sources)
        metrics.update({f"verdicts/{k}": v for k, v in verdicts.items()})
        metrics.update(judge_call_stats(batch))
        # the reward-hacking watch: false passes, length against reward, neutralised text
        watch, examples, flags = step_watch(batch, sources)
        metrics.update(watch)
        metrics.update(self._restart_metrics(step + 1))
        if errors:
            logger.warning(
                "step %d: %d of %d samples have no reward (judge_error, kept out of the loss); "
                "reward mean %s over the %d scored",
                step + 1,
                errors,
                len(batch),
                _fmt(metrics["rollout/reward_mean"]),
                metrics["rollout/reward_samples"],
            )
        if restarts:
            logger.warning(
                "step %d: %d rollout engine re-creation(s); the requests they held were sent "
                "again, every sample is in the step once",
                step + 1,
                restarts,
            )
        if self.evaluation.due(step + 1):
            if self.stop.requested:
                logger.warning("step %d: evaluation skipped (stopping)", step + 1)
            else:
                with self.clock.timed("eval", times):
                    metrics.update(await self.evaluate(step + 1))
        metrics.update({f"time/{k}": v for k, v in times.items()})
        # every sleep / wake / offload / onload of this step, summed per participant and action
        metrics.update({f"handoff/{k}": v for k, v in self.phases.take_timings().items()})
        metrics["weights/sync_path"] = self.weight_sync.path
        metrics.update(self._memory)
        self._memory = {}
        # written before the checkpoint: a save that fails loses none of it
        self.metrics.log(step + 1, metrics)
        rows = [sample_row(s, f) for s, f in zip(batch, flags, strict=True)]
        self.metrics.log_samples(f"step_{step + 1:06d}", rows, step=step + 1)
        self.metrics.log_watch(step + 1, examples)
        self.history.append(StepRecord(step + 1, metrics, times, verdicts, untrained))
        if self.checkpoints.due(step + 1):
            with self.clock.timed("save", times):
                await self.checkpoints.save(step + 1, self._state())

    def _restart_metrics(self, step: int) -> dict[str, Any]:
        """``run/restarts`` (the run's restarts so far) on every step; on the first step after
        a restart, what was lost and the checkpoint step the run went on from, and a line."""
        out: dict[str, Any] = {"run/restarts": len(self.restarts)}
        told, self._restart_untold = self._restart_untold, None
        if told is not None:
            out["run/restarted_from_step"] = told.step
            out["run/lost"] = told.lost
            logger.warning(
                "step %d: the run restarted from its checkpoint of step %d (restart %d: %s)",
                step,
                told.step,
                told.number,
                told.lost,
            )
        return out

    @property
    def scorer(self) -> RolloutScorer:
        """Generate-and-score on this run's engines and reward path (``rl_core.scoring``, shared
        with the evaluations and ``rl-core eval``)."""
        return RolloutScorer(self.engines, self.tokenizer, self.rewards, self.phases, self.clock)

    async def _generate_and_score(
        self, groups: list[list[Sample]], settings: RolloutSettings, **how: Any
    ) -> list[Sample]:
        """:class:`~rl_core.scoring.RolloutScorer` on this run's engines (a training step)."""
        return await self.scorer(groups, settings, **how)

    async def _generate_awake(
        self, groups: list[list[Sample]], settings: RolloutSettings, **how: Any
    ) -> list[Sample]:
        """:meth:`RolloutScorer.awake <rl_core.scoring.RolloutScorer.awake>`: outside a step,
        on woken engines."""
        return await self.scorer.awake(groups, settings, **how)

    def _check_staleness(self, batch: list[Sample], max_staleness: int) -> None:
        for s in batch:
            if s.weight_version is None:
                continue
            lag = self.weight_version - s.weight_version
            if lag > max_staleness or lag < 0:
                raise StaleWeightsError(
                    f"sample g{s.group_id}/{s.index} was generated with weight version "
                    f"{s.weight_version}, the policy is at {self.weight_version} "
                    f"(allowed staleness {max_staleness} in mode {self.cfg.mode})"
                )

    async def evaluate(self, step: int) -> dict[str, Any]:
        """The evaluation after step ``step`` (``rl_core.evaluation``), on awake engines."""
        return await self.evaluation.run(step, self._generate_awake, self.settings)

    # --- metrics ---------------------------------------------------------------------------------

    def _rollout_metrics(self, batch: list[Sample]) -> dict[str, Any]:
        rewards = [s.reward for s in batch if s.reward is not None]
        accs = [a for a in (accuracy(s) for s in batch) if a is not None]
        lens = [s.response_length for s in batch]
        return {
            "rollout/samples": len(batch),
            # the samples the mean is over: judge errors have no reward and are not in it
            "rollout/reward_samples": len(rewards),
            "rollout/reward_mean": statistics.fmean(rewards) if rewards else None,
            "rollout/reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "rollout/acc_mean": statistics.fmean(accs) if accs else None,
            "rollout/unparsed": sum(1 for s in batch if s.status == "unparsed"),
            "rollout/aborted": sum(1 for s in batch if s.status == "aborted"),
            "rollout/response_len_mean": statistics.fmean(lens),
            # cut off at the length limit: judged, and in the reward mean above, but out of the
            # loss and of the group statistics unless --keep-cut-off
            "rollout/truncated": sum(1 for s in batch if s.cut_off),
            "rollout/in_loss": sum(1 for s in batch if s.in_loss),
            # --group-judge-deadline-s: not judged in time (left out, never 0), and lone
            # scored responses of a group the deadline thinned out (no baseline: left out)
            "rollout/judge_timeouts": sum(1 for s in batch if s.status == "judge_timeout"),
            "rollout/no_baseline": sum(1 for s in batch if s.left_out == "no_baseline"),
            **rule_agreement(batch, [verdict_source(s) for s in batch], "rollout/"),
            **panel_agreement(batch, "rollout/"),
            **pairwise_flips(batch, "rollout/"),
        }


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
