"""Every deadline of rl-core, and the thresholds of its reward-hacking watch, written once: the
other modules import them from here.

Before, rl-core kept its own 1800 / 600 s values in four modules, and the calls to trainer ranks
had no deadline at all (they relied on torch.distributed's own). The rule, as in genrm-serve's
``limits.py``: every call to an actor has a deadline, and a wait that holds another one is the
longer of the two, so the inner wait's own error (which says what hung) arrives first. The
nesting is spelled out next to each value and checked in ``tests/test_limits.py``.
"""

from __future__ import annotations

from typing import Final

from genrm_serve import ENGINE_START_TIMEOUT_S, WEIGHT_GROUP_TIMEOUT_S

__all__ = [
    "ENGINE_CALL_TIMEOUT_S",
    "ENGINE_PROBE_TIMEOUT_S",
    "ENGINE_START_TIMEOUT_S",
    "FAILED_STEP_PROBE_S",
    "PLACEMENT_TIMEOUT_S",
    "PROCESS_GROUP_TIMEOUT_S",
    "RANK_LOSS_SETTLE_S",
    "RAY_CALL_SETTLE_S",
    "REWARD_TIMEOUT_S",
    "SERVE_DEPLOY_TIMEOUT_S",
    "TRAINER_CALL_TIMEOUT_S",
    "TRAINER_PROBE_TIMEOUT_S",
    "TRAINER_START_TIMEOUT_S",
    "WAIT_WORD_EVERY_S",
    "WATCH_FALSE_PASS_SHARE",
    "WATCH_LENGTH_GROWTH",
    "WATCH_LENGTH_GROWTH_CORR",
    "WATCH_LEN_REWARD_CORR",
    "WATCH_MIN_SAMPLES",
    "WATCH_NEUTRALISED_SHARE",
    "WEIGHT_GROUP_TIMEOUT_S",
]

# ---- start-up ----------------------------------------------------------------------------------

#: Placement groups created, ready and located (``realize.create_placement_groups``).
PLACEMENT_TIMEOUT_S: Final = 600.0
#: How often a wait on Ray (placement groups, actors' start, the judge service's deploy and its
#: engines) says what it still waits for: no wait is silent for longer.
WAIT_WORD_EVERY_S: Final = 5.0
#: The embedded judge service's deploy: Serve schedules and constructs its ingress replica
#: (which asks for no CPU, see ``services.start_judge_service``); its engines' load is waited
#: for after it, under ``ENGINE_START_TIMEOUT_S``.
SERVE_DEPLOY_TIMEOUT_S: Final = 300.0
#: How long a cancelled start-up waits for a blocking Ray call in a thread to return.
RAY_CALL_SETTLE_S: Final = 30.0
#: How long trainer ranks wait for each other in a ``torch.distributed`` collective, joining
#: the process group included (the group's own timeout, enforced on the ranks).
PROCESS_GROUP_TIMEOUT_S: Final = 600.0
#: A trainer rank's start: join the process group (up to :data:`PROCESS_GROUP_TIMEOUT_S`), then
#: load the model, as long as an engine's model load (genrm-serve's ``ENGINE_START_TIMEOUT_S``).
TRAINER_START_TIMEOUT_S: Final = PROCESS_GROUP_TIMEOUT_S + ENGINE_START_TIMEOUT_S

# ---- the loop ----------------------------------------------------------------------------------

#: One call to a rollout engine (a batch's generate, sleep, wake, one weight update). A weight
#: update over a broadcast group waits inside it for the group (``WEIGHT_GROUP_TIMEOUT_S``).
ENGINE_CALL_TIMEOUT_S: Final = 1800.0
#: A read of an engine's stats or whereabouts (the memory probe, the layout report).
ENGINE_PROBE_TIMEOUT_S: Final = 60.0
#: One reward call (a sample's, or a batch's in defer mode); past it the samples are judge
#: errors. Above genrm-client's own total per request (120 s), so its retries fit inside.
REWARD_TIMEOUT_S: Final = 600.0
#: One call to the trainer ranks that computes: a rollout's training, log-probs, a weight
#: export or broadcast, offload / onload, save / load. Inside it, the ranks' collectives wait up
#: to :data:`PROCESS_GROUP_TIMEOUT_S` (a rank that hangs fails there first).
TRAINER_CALL_TIMEOUT_S: Final = 3600.0
#: A call to the trainer ranks that failed: how long the other ranks' answers are waited for,
#: to find a rank that died (Ray's ``ActorDiedError``, which restarts the run from its
#: checkpoint, ``rl_core.restarts``) behind a survivor's own error (gloo's "connection closed by
#: peer" may arrive first). Only a failed call waits it.
RANK_LOSS_SETTLE_S: Final = 10.0
#: A step that failed for a reason of its own (its judge failures, a deadline): how long the run's
#: trainer ranks and rollout engines are asked whether they are still there, to find a process
#: lost behind that failure (a node that went away takes its judge engine too, and the judge's
#: failures may come first); a run that lost one restarts from its checkpoint instead of ending.
FAILED_STEP_PROBE_S: Final = 10.0
#: A question to the trainer ranks that computes nothing (where they run, their memory, rank 0's
#: address).
TRAINER_PROBE_TIMEOUT_S: Final = 60.0

# ---- the reward-hacking watch (``rl_core.watch``) ------------------------------------------------
# Not deadlines: the shares and correlations past which the closing summary (and ``rl-core show``)
# prints a warning line. Each step's ``watch/`` metrics are recorded whatever their value.

#: Share of a step's judged answers that the judge passed (a 1) and math-verify proved unequal to
#: the reference (``--rule-audit``): past it, the policy may have found what fools the judge.
WATCH_FALSE_PASS_SHARE: Final = 0.10
#: Pearson correlation of response length with reward within a step: past it, longer answers are
#: being paid for being long.
WATCH_LEN_REWARD_CORR: Final = 0.5
#: The fewest samples a step needs before its own share or correlation is read as a signal (the
#: shares are also read over the whole run, whatever the steps' sizes).
WATCH_MIN_SAMPLES: Final = 8
#: The mean response length of the last step over the first's: past it, while the run's mean
#: correlation of length with reward is above :data:`WATCH_LENGTH_GROWTH_CORR`, the summary
#: warns that the length grows with the reward.
WATCH_LENGTH_GROWTH: Final = 1.5
WATCH_LENGTH_GROWTH_CORR: Final = 0.2
#: Share of a step's judged answers whose text the prompt builder had to neutralise (template
#: tokens, block markers, template headers, judge-directed lines).
WATCH_NEUTRALISED_SHARE: Final = 0.05
