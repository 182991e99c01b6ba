"""The GRPO driver: rollout → rewards → advantages → train → weight sync → eval → save.

:meth:`GRPOTrainer.run` is meant to read like the algorithm. Everything it talks to is injected —
a training backend, rollout engine handles, a phase machine built from the placement plan, reward
functions — so the same loop runs on a GPU cluster, on this CPU machine, and in tests with tiny
models. Building those parts from flags (Ray, the judge service, engines) is ``rl_core.launch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from genrm_rewards.types import BatchRewardFn, RewardFn
from rl_core.backends.base import TrainItem
from rl_core.checkpoints import LATEST, checkpoint_path, keep_last, step_folder
from rl_core.config import TrainConfig
from rl_core.data import PromptCursor, PromptDataset
from rl_core.distributed import ForwardGroup, Learner
from rl_core.engines import EngineHandle, StaleWeightsError
from rl_core.grpo.advantages import Advantages, grpo_advantages
from rl_core.judge_audit import rule_agreement
from rl_core.metrics import MetricsWriter, PhaseClock
from rl_core.phases import PhaseMachine
from rl_core.rewards import (
    InlineRewards,
    PostProcessContext,
    PostProcessHook,
    check_judge_errors,
    check_scored,
    judgeable,
)
from rl_core.rollout import SEED_EVAL, SEED_TRAIN, RolloutSettings, generate_groups, make_group
from rl_core.sample import Sample
from rl_core.stopping import StopRequest
from rl_core.weight_sync import ObjectStoreSync, WeightSync

#: Reads GPU memory now: ``{gpu: used GB}`` for every GPU of the run (see ``rl_core.launch``).
MemoryProbe = Callable[[], Awaitable[dict[str, float]]]

logger = logging.getLogger(__name__)
T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; what the step wrote before it (metrics, samples,
    evaluation) is kept."""


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


@dataclass
class RewardSetup:
    """The reward path of a run: inline function, or deferred with a post-process hook."""

    args: Any
    reward_key: str
    inline_fn: RewardFn | None
    batch_fn: BatchRewardFn | None = None
    post_process: PostProcessHook | None = None
    concurrency: int = 32

    @property
    def deferred(self) -> bool:
        return self.post_process is not None


def verdict_source(sample: Sample) -> str:
    """Where a sample's reward came from: rule gate, judge, cache, or an error / other rule."""
    d = sample.reward_details
    if sample.status in ("judge_error", "aborted"):
        return sample.status
    if d.get("gate") == "hit":
        return "gate"
    if d.get("cache") == "hit":
        return "judge_cache"
    if sample.status == "unparsed":
        return "judge_unparsed"
    if "gate" in d or "route_key" in d:
        return "judge"
    return "rule"


def sample_row(s: Sample) -> dict[str, Any]:
    """One sample as a JSON record for ``RUN_DIR/samples/``."""
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
    }


def _acc(sample: Sample) -> float | None:
    if sample.reward is None:
        return None
    acc = sample.reward_details.get("acc")
    if isinstance(acc, int | float) and not isinstance(acc, bool):
        return float(acc)
    return 1.0 if sample.reward > 0.5 else 0.0


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
        eval_data: PromptDataset | None = None,
        reference: ForwardGroup | None = None,
        actor_fwd: ForwardGroup | None = None,
        overlap: bool = False,
        metrics: MetricsWriter | None = None,
        clock: PhaseClock | None = None,
        weight_sync: WeightSync | None = None,
        memory_probe: MemoryProbe | None = None,
        stop: StopRequest | None = None,
        seeded: bool = True,
    ) -> None:
        self.cfg = cfg
        #: the run's seed reaches the rollout engines' sampling (not where they cannot honour it)
        self._sampling_seed = cfg.seed if seeded else None
        self.learner = learner
        self.tokenizer = tokenizer
        self.engines = list(rollout_engines)
        self.phases = phases
        self.rewards = rewards
        self.train_data = train_data
        self.eval_data = eval_data
        self.reference = reference
        self.actor_fwd = actor_fwd
        #: fully-async: step k+1's rollout runs while step k trains (samples ≤ 1 version stale)
        self.overlap = overlap
        self.metrics = metrics or MetricsWriter(cfg.run_dir)
        self.clock = clock or PhaseClock()
        #: how weights reach the engines (the plan chooses: CUDA IPC, broadcast, object store)
        self.weight_sync: WeightSync = weight_sync or ObjectStoreSync(learner, self.engines)
        self.memory_probe = memory_probe
        #: SIGTERM / SIGINT: stop at the next safe point and save the last completed step
        self.stop = stop
        #: what the run did on a stop signal, in one line (None: it was not stopped)
        self.stop_report: str | None = None
        self._saved_step = 0
        self._memory: dict[str, float] = {}
        self.cursor = PromptCursor(size=len(train_data), seed=cfg.seed)
        if not cfg.rollout_shuffle:
            self.cursor._order = lambda epoch: list(range(len(train_data)))  # type: ignore[method-assign]
        self.weight_version = 0
        self.start_step = 0
        self.history: list[StepRecord] = []
        self.eval_history: list[dict[str, Any]] = []
        self.settings = RolloutSettings(
            n_samples_per_prompt=cfg.n_samples_per_prompt,
            max_response_len=cfg.rollout_max_response_len,
            temperature=cfg.rollout_temperature,
            top_p=cfg.rollout_top_p,
            top_k=cfg.rollout_top_k,
            stop=tuple(cfg.rollout_stop or ()),
            apply_chat_template=cfg.apply_chat_template,
            max_prompt_len=cfg.rollout_max_prompt_len,
            need_logprobs=cfg.use_tis,
            seed=self._sampling_seed,
            keep_cut_off=cfg.keep_cut_off,
        )
        #: steps in a row that trained nothing (no sample in the loss)
        self._untrained_steps = 0

    # --- the loop --------------------------------------------------------------------------------

    async def run(self) -> list[StepRecord]:
        """Train for ``--num-rollout`` steps (from the loaded checkpoint, if any).

        Each step: generate and score → advantages → train → weights to the rollout engines.
        In fully-async the next step's rollout is started before this step trains. On a stop
        signal the step still in rollout is abandoned, a step that trains is finished, and the
        last completed step is saved (with ``--save``).
        """
        if self.cfg.load:
            await self.load(Path(self.cfg.load))
        steps = range(self.start_step, self.cfg.num_rollout)
        if self.cfg.eval_before_and_after and self.eval_data is not None and steps:
            t0 = time.perf_counter()
            before = await self.evaluate(self.start_step)
            self.metrics.log(self.start_step, {**before, "time/eval": time.perf_counter() - t0})
        ahead: asyncio.Task[tuple[list[Sample], dict[str, float]]] | None = None
        if self.stop is not None:
            self.stop.graceful = True  # a signal now stops at a safe point (and saves)
        for step in steps:
            if self.stopping:
                break
            await self.phases.enter("inference")
            rolled = await self._unless_stopped(ahead or self.rollout(step))
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
        if self.stopping:
            await self._save_on_stop(ahead)
        if self.stop is not None:
            self.stop.abrupt()
        self.metrics.close()
        return self.history

    async def _train_and_sync(
        self, batch: list[Sample], times: dict[str, float]
    ) -> dict[str, float]:
        """The step's optimizer steps, then its weights to the rollout engines."""
        await self.phases.enter("train")
        t0 = time.perf_counter()
        train_metrics = await self.train(batch)
        times["train"] = time.perf_counter() - t0
        await self.record_memory("train")

        t0 = time.perf_counter()
        if not self.overlap:
            await self.phases.enter("inference")
        times["wake"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        await self.sync_weights(self.weight_version + 1)
        times["weight_sync"] = time.perf_counter() - t0
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

    @property
    def stopping(self) -> bool:
        return self.stop is not None and self.stop.requested

    async def _unless_stopped(self, work: Awaitable[T]) -> T | None:
        """``work``'s result, or None when a stop signal came first (``work`` is cancelled:
        nothing of a rollout is kept, the next run redoes the step)."""
        task = asyncio.ensure_future(work)
        if self.stop is None:
            return await task
        waiter = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        return None if task.cancelled() else task.result()

    async def _save_on_stop(self, ahead: asyncio.Task[Any] | None) -> None:
        """The last completed step saved (unless it is already), and what was saved said in
        :attr:`stop_report`; a rollout started ahead (fully-async) is dropped."""
        assert self.stop is not None
        if ahead is not None:
            ahead.cancel()
            with contextlib.suppress(BaseException):
                await ahead
        done = self.history[-1].step if self.history else self.start_step
        where = f"stopped by {self.stop.name} after step {done} of {self.cfg.num_rollout}"
        if not self.cfg.save:
            self.stop_report = f"{where}: nothing saved (no --save)"
        elif done == 0:
            self.stop_report = f"{where}: nothing to save"
        elif done == self._saved_step:
            root = Path(self.cfg.save)
            self.stop_report = (
                f"{where}: checkpoint {step_folder(root, done)} (resume with --load {root})"
            )
        else:
            root = Path(self.cfg.save)
            path = await self.save(root, done)
            self.stop_report = f"{where}: saved {path} (resume with --load {root})"

    # --- the parts of a step ---------------------------------------------------------------------

    async def rollout(self, step: int) -> tuple[list[Sample], dict[str, float]]:
        """Generate the step's groups and score every sample (inline as groups finish, or the
        whole batch after rollout in defer mode)."""
        cfg = self.cfg
        idx = self.cursor.take(cfg.rollout_batch_size)
        groups = [
            make_group(self.train_data.records[i], gid, cfg.n_samples_per_prompt)
            for gid, i in enumerate(idx)
        ]
        times: dict[str, float] = {}
        batch = await self._generate_and_score(
            groups, self.settings, seed_key=(SEED_TRAIN, step), label="rollout", times=times
        )
        check_scored(batch)
        return batch, times

    def advantages(self, batch: list[Sample]) -> Advantages:
        """GRPO advantages over the samples in the loss; the others get 0 and stay out of their
        group's mean and std (one membership rule for both: ``Sample.in_loss``)."""
        adv = grpo_advantages(
            [s.reward if s.in_loss else None for s in batch],
            [s.group_id for s in batch],
            normalize_std=self.cfg.grpo_std_normalization,
        )
        for s, a, ok in zip(batch, adv.values, adv.valid, strict=True):
            s.advantage = a if ok else 0.0
        return adv

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
        times: dict[str, float],
        untrained: str | None = None,
    ) -> None:
        """Metrics, evaluation, checkpoint and sample dump of a step (``untrained``: why it
        trained nothing, when it did not)."""
        metrics = self._rollout_metrics(batch)
        metrics.update({f"train/{k}": v for k, v in train_metrics.items()})
        metrics["train/untrained"] = 0 if untrained is None else 1
        if untrained is not None:
            metrics["train/untrained_reason"] = untrained
        metrics.update(
            {
                "adv/nonzero": sum(1 for a in adv.values if a != 0.0),
                "adv/abs_mean": statistics.fmean(abs(a) for a in adv.values),
                "adv/degenerate_groups": adv.num_degenerate_groups,
                "adv/groups": adv.num_groups,
                "rollout/judge_errors": errors,
                "weights/version": self.weight_version,
            }
        )
        verdicts = Counter(verdict_source(s) for s in batch)
        metrics.update({f"verdicts/{k}": v for k, v in verdicts.items()})
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
        last = step + 1 == self.cfg.num_rollout and self.cfg.eval_before_and_after
        if (self.cfg.eval_interval and (step + 1) % self.cfg.eval_interval == 0) or last:
            if self.stopping:
                logger.warning("step %d: evaluation skipped (stopping)", step + 1)
            else:
                t0 = time.perf_counter()
                metrics.update(await self.evaluate(step + 1))
                times["eval"] = time.perf_counter() - t0
        metrics.update({f"time/{k}": v for k, v in times.items()})
        # every sleep / wake / offload / onload of this step, summed per participant and action
        metrics.update({f"handoff/{k}": v for k, v in self.phases.take_timings().items()})
        metrics["weights/sync_path"] = self.weight_sync.path
        metrics.update(self._memory)
        self._memory = {}
        # written before the checkpoint: a save that fails loses none of it
        self.metrics.log(step + 1, metrics)
        self.metrics.log_samples(f"step_{step + 1:06d}", [sample_row(s) for s in batch])
        self.history.append(StepRecord(step + 1, metrics, times, verdicts, untrained))
        if self.cfg.save and (
            (self.cfg.save_interval and (step + 1) % self.cfg.save_interval == 0)
            or step + 1 == self.cfg.num_rollout
        ):
            t0 = time.perf_counter()
            await self.save(Path(self.cfg.save), step + 1)
            times["save"] = time.perf_counter() - t0

    async def _generate_and_score(
        self,
        groups: list[list[Sample]],
        settings: RolloutSettings,
        *,
        seed_key: tuple[int, int],
        label: str,
        times: dict[str, float],
    ) -> list[Sample]:
        inline = None
        if not self.rewards.deferred:
            assert self.rewards.inline_fn is not None
            inline = InlineRewards(
                self.rewards.inline_fn,
                self.rewards.args,
                reward_key=self.rewards.reward_key,
                concurrency=self.rewards.concurrency,
            )
        n = sum(len(g) for g in groups)
        t0 = time.perf_counter()
        with self.clock.phase(label, total=n) as advance:

            def done(group: list[Sample]) -> None:
                advance(len(group))
                if inline is not None:
                    inline.submit(judgeable(group))

            await generate_groups(
                self.engines, groups, self.tokenizer, settings, done, seed_key=seed_key
            )
        times[label] = time.perf_counter() - t0
        samples = [s for g in groups for s in g]
        t0 = time.perf_counter()
        with self.clock.phase("reward", total=None):
            if inline is not None:
                await inline.drain()
            else:
                assert self.rewards.post_process is not None and self.rewards.batch_fn is not None
                ctx = PostProcessContext(
                    self.rewards.args, self.phases, self.rewards.batch_fn, self.rewards.reward_key
                )
                await self.rewards.post_process(ctx, judgeable(samples))
        times["reward_wait" if inline is not None else "reward"] = time.perf_counter() - t0
        return samples

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
        """Accuracy (pass@1 over n samples) and mean reward on the evaluation set."""
        if self.eval_data is None:
            return {}
        cfg = self.cfg
        records = self.eval_data.records[: cfg.eval_limit]
        groups = [
            make_group(r, gid, cfg.n_samples_per_eval_prompt) for gid, r in enumerate(records)
        ]
        settings = RolloutSettings(
            n_samples_per_prompt=cfg.n_samples_per_eval_prompt,
            max_response_len=cfg.eval_max_response_len or cfg.rollout_max_response_len,
            temperature=cfg.eval_temperature
            if cfg.eval_temperature is not None
            else cfg.rollout_temperature,
            top_p=cfg.rollout_top_p,
            top_k=cfg.rollout_top_k,
            stop=self.settings.stop,
            apply_chat_template=cfg.apply_chat_template,
            need_logprobs=False,
            seed=self._sampling_seed,
            keep_cut_off=cfg.keep_cut_off,
        )
        if self.phases.current != "inference":
            await self.phases.enter("inference")
        samples = await self._generate_and_score(
            groups, settings, seed_key=(SEED_EVAL, step), label="eval", times={}
        )
        if self.rewards.deferred:
            await self.phases.enter("inference")
        scored = [s for s in samples if s.reward is not None]
        per_prompt: dict[int, list[float]] = {}
        for s in scored:
            a = _acc(s)
            if a is not None:
                per_prompt.setdefault(s.group_id, []).append(a)
        pass1 = [statistics.fmean(v) for v in per_prompt.values()]
        out = {
            "eval/accuracy": statistics.fmean(pass1) if pass1 else None,
            "eval/reward_mean": statistics.fmean([s.reward or 0.0 for s in scored])
            if scored
            else None,
            "eval/judge_errors": sum(1 for s in samples if s.status == "judge_error"),
            "eval/samples": len(samples),
            "eval/response_len_mean": statistics.fmean(s.response_length for s in samples),
            **rule_agreement(samples, [verdict_source(s) for s in samples], "eval/"),
        }
        self.eval_history.append({"step": step, **out})
        return out

    # --- metrics, checkpoints --------------------------------------------------------------------

    def _rollout_metrics(self, batch: list[Sample]) -> dict[str, Any]:
        rewards = [s.reward for s in batch if s.reward is not None]
        accs = [a for a in (_acc(s) for s in batch) if a is not None]
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
            **rule_agreement(batch, [verdict_source(s) for s in batch], "rollout/"),
        }

    async def save(self, root: Path, step: int) -> Path:
        """Write step ``step``'s checkpoint, point ``latest`` at it, then keep the newest
        ``--save-keep``. Raises :class:`CheckpointError` naming the step and the cause."""
        path = step_folder(root, step)
        try:
            await self.learner.save(
                path,
                {
                    "rollout_step": step,
                    "cursor": self.cursor.state(),
                    "weight_version": self.weight_version,
                },
            )
            (root / LATEST).write_text(path.name)
        except OSError as err:
            raise CheckpointError(
                f"saving step {step} to {path} failed: {err}; its metrics, samples and "
                f"evaluation are in {self.cfg.run_dir}"
            ) from err
        self._saved_step = step
        if self.cfg.save_keep:
            for gone in await asyncio.to_thread(keep_last, root, self.cfg.save_keep):
                logger.info("removed checkpoint %s (--save-keep %d)", gone, self.cfg.save_keep)
        return path

    async def load(self, root: Path) -> None:
        """Resume from ``root``'s checkpoint: weights, optimizer, data position; what the run
        directory recorded beyond its step (metrics, samples, TensorBoard) is cut, so the
        steps redone are not recorded twice."""
        path = checkpoint_path(root)
        extra = await self.learner.load(path)
        self.cursor.restore(extra["cursor"])
        self.start_step = self._saved_step = int(extra["rollout_step"])
        self.metrics.truncate(self.start_step)
        if self.phases.current not in (None, "inference"):
            await self.phases.enter("inference")  # engines take weights awake
        await self.sync_weights(int(extra["weight_version"]))
        logger.info("resumed from %s at step %d", path, self.start_step)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
