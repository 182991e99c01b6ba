"""Every deadline and bound of genrm-serve, written once: the other modules import them from here.

Before, the worker's start deadline (900 s) and the supervisor's (1800 s) disagreed and the
shorter one won silently; the same numbers were written in five places. A deadline that two
layers enforce now takes the same constant in both, so they cannot drift apart. ``ServeArgs``
exposes the per-deployment ones as fields defaulting to these values (tests shrink them).
"""

from __future__ import annotations

from typing import Final

# ---- engines: start, requests, health ---------------------------------------------------------

#: Loading one engine's model: the supervisor's wait and the worker's own start deadline, and
#: the default of ``genrm-serve run --ready-timeout`` (the embedded Gemma converts once, ~50 s).
ENGINE_START_TIMEOUT_S: Final = 1800.0
#: One judge request, queueing in the router and in the engine actor included: the one deadline
#: of a request, from its arrival at the router. The waits inside it (for an engine slot, the
#: engine call, a retry on another engine, the engine actor's queue) each take what is left of
#: it, never a fresh one of their own (``router``); an engine actor called directly (rl-core)
#: bounds its queue wait by it too.
REQUEST_TIMEOUT_S: Final = 600.0
#: One health probe of an engine.
PROBE_TIMEOUT_S: Final = 10.0
#: How often the supervisor probes every engine.
HEALTH_CHECK_PERIOD_S: Final = 2.0
#: Sleep / wake of every engine of an instance.
SLEEP_TIMEOUT_S: Final = 300.0
#: An engine's orderly shutdown by its caller (batcher stopped, model released, a CPU engine's
#: weight snapshot removed) before its actor is killed anyway.
ENGINE_SHUTDOWN_TIMEOUT_S: Final = 60.0
#: How long an engine's ``sleep()`` lets its queued requests finish before failing them.
DRAIN_TIMEOUT_S: Final = 120.0
#: Delay before re-creating a dead engine; doubles on each failure in a row up to the max.
RESTART_BACKOFF_S: Final = 1.0
RESTART_BACKOFF_MAX_S: Final = 30.0
#: How long a process waits for another's conversion of the embedded model.
MODEL_LOCK_TIMEOUT_S: Final = 900.0

# ---- the SGLang engine (``engines/sglang``) ------------------------------------------------------

#: Longest ``sleep()`` retries SGLang's ``flush_cache`` while it still has requests (slime:
#: 60 x 1 s), and the pause between two tries. Inside :data:`SLEEP_TIMEOUT_S`, with the drain.
SGLANG_FLUSH_DEADLINE_S: Final = 60.0
SGLANG_FLUSH_RETRY_S: Final = 0.5
#: The SGLang engine's own health probe (one generated token), and the window in which an output
#: that arrived spares it. Shorter than :data:`PROBE_TIMEOUT_S` on purpose, not the same value:
#: the worker's deadline holds this one, so the engine's error ("SGLang is hung or overloaded")
#: arrives first instead of the worker's bare timeout.
SGLANG_PROBE_TIMEOUT_S: Final = 5.0
#: How often the engine looks whether one of SGLang's child processes has exited.
SGLANG_CHILD_WATCH_S: Final = 1.0
#: The longest a request waits for the request of its group that is computing their shared run
#: (``engines/sglang/prefix_warmup.py``). A judge's prompt of a few hundred tokens is prefilled in
#: tens of ms; a leader still running after this is decoding (a thinking judge), and SGLang has
#: its prompt in the radix cache by then (0.5.17 caches a request's prompt once its prefill is
#: done: ``batch_result_processor.py``, ``maybe_cache_unfinished_req``).
SGLANG_FOLLOW_WAIT_S: Final = 0.5
#: How long a shutdown waits for one engine's killed processes to be reaped (SGLang's own).
SGLANG_SHUTDOWN_REAP_S: Final = 60.0
#: A child that dies while SGLang starts writes its traceback just before it exits: how long the
#: start's error waits for that text to reach the stderr tail (``engines/sglang/process.py``).
SGLANG_STDERR_SETTLE_S: Final = 0.5

# ---- weights ---------------------------------------------------------------------------------

#: One weight update of an engine, any transport (a caller may give its own: rl-core does).
WEIGHT_UPDATE_TIMEOUT_S: Final = 1800.0
#: How long the members of a weight-broadcast group (trainer rank 0 and the engines) wait for
#: each other: the group's store and its collectives. The calls that form and use the group
#: have longer deadlines (:data:`WEIGHT_UPDATE_TIMEOUT_S`, rl-core's), so this one's error
#: arrives first.
WEIGHT_GROUP_TIMEOUT_S: Final = 600.0

# ---- the Serve deployment (the ingress replica) -----------------------------------------------

#: Ray Serve's own probe of the ingress replica (its defaults, set explicitly).
SERVE_HEALTH_CHECK_PERIOD_S: Final = 10.0
SERVE_HEALTH_CHECK_TIMEOUT_S: Final = 30.0
SERVE_GRACEFUL_SHUTDOWN_TIMEOUT_S: Final = 20.0

# ---- requests --------------------------------------------------------------------------------

#: Largest request body the service reads (413 beyond it, before any parsing). A GRPO group of
#: 16 judge prompts of 8k tokens is ~0.5 MB; 4 MiB leaves room without letting one client
#: make the ingress buffer arbitrary amounts.
MAX_REQUEST_BODY_BYTES: Final = 4 * 1024 * 1024
#: ``Retry-After`` of a 503 for an instance without a healthy engine (the supervisor re-creates
#: a dead engine within seconds) and for a sleeping instance.
UNAVAILABLE_RETRY_AFTER_S: Final = 1.0
ASLEEP_RETRY_AFTER_S: Final = 5.0

# ---- the CLI ---------------------------------------------------------------------------------

#: ``genrm-serve run``: how often it polls ``/health`` while the engines load, the HTTP deadline
#: of one poll, and how often a non-terminal gets a progress line.
HEALTH_POLL_S: Final = 0.5
HEALTH_POLL_TIMEOUT_S: Final = 5.0
PROGRESS_EVERY_S: Final = 15.0
#: How long the HTTP proxy of a deployed app may answer nothing at all (connection refused or
#: timed out, not a 503 "engines loading") before waiting for health gives up: the proxy is gone.
SERVE_UNREACHABLE_S: Final = 120.0
#: Tearing Serve down: how long to wait for its controller to be gone (the next run on the
#: cluster must not meet a controller that is still shutting down: it kills the new proxies).
SERVE_GONE_WAIT_S: Final = 60.0
#: Starting Serve where one already runs: how long its controller may take to say on which port
#: its HTTP proxy listens (``app.start_proxy`` refuses another port; past this, it does not ask).
SERVE_PORT_ASK_S: Final = 10.0
#: ``serve.start`` attempts while Serve's controller replaces an HTTP proxy that was slow to
#: start (see ``app.deploy``).
PROXY_START_ATTEMPTS: Final = 3
#: Free ports tried when Serve's proxy loses the one it was given to another process (see
#: ``app.start_proxy``).
FREE_PORT_ATTEMPTS: Final = 3
#: ``genrm-serve status``: the HTTP deadline of its two requests.
STATUS_TIMEOUT_S: Final = 10.0
#: ``genrm-serve shutdown``: how long it waits for the app to be deleted.
SHUTDOWN_WAIT_S: Final = 60.0
#: ``genrm-serve run`` on SIGINT / SIGTERM: how long tearing down the deployment may take
#: before the Ray instance it started is stopped anyway.
TEARDOWN_TIMEOUT_S: Final = 20.0
