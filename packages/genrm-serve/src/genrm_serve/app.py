"""Build and deploy the GenRM Serve application: the one place that calls ``.bind()``.

Two ways in, one app:

* standalone (``genrm-serve run``): ``build_app(instances)``; the ingress makes one placement
  group per instance (GPU bundles when the cluster has GPUs, CPU-only otherwise) and creates,
  starts and supervises its engine actors;
* embedded (rl-core): ``build_app(instances, engines={route_key: [EngineRef | handle | name]})``
  with engine actors that rl-core placed into its own bundles. Give an ``EngineRef`` a
  ``placement`` and the service re-creates a dead engine there; without one it waits for Ray to
  restart the actor (``max_restarts``) and starts it again.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import httpx
from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

from genrm_serve import limits
from genrm_serve.config import GenRMConfigError, InstanceSpec
from genrm_serve.engine_refs import EngineSource, engine_actor_name, normalize_engines
from genrm_serve.ingress import GenRMIngress
from genrm_serve.serve_args import ServeArgs

__all__ = [
    "ServeRunningError",
    "build_app",
    "deploy",
    "free_port",
    "refuse_another_serve",
    "shutdown_serve",
    "start_proxy",
    "wait_until_healthy",
]

logger = logging.getLogger(__name__)


def _max_ongoing(instances: Mapping[str, InstanceSpec], args: ServeArgs) -> int:
    if args.max_ongoing_requests is not None:
        return args.max_ongoing_requests
    total = 0
    for spec in instances.values():
        per_engine = args.engine_inflight_limit or 2 * spec.engine_config.max_batch_size
        total += spec.num_engines * per_engine + spec.engine_config.max_queued_requests
    # Twice what admission lets through, so that excess requests reach the ingress and get a
    # quick 429 instead of waiting unseen in Serve's own queue.
    return max(1024, 2 * total)


def build_app(
    instances: Mapping[str, InstanceSpec],
    *,
    engines: Mapping[str, Sequence[EngineSource]] | None = None,
    args: ServeArgs | None = None,
) -> Application:
    """The Serve application for ``instances`` (validated specs, e.g. from ``build_instances``).

    Args:
        instances: ``{route_key: InstanceSpec}``; at least one.
        engines: engine actors created elsewhere, per route_key (an ``EngineRef``, an actor
            handle, or a named actor's name). Instances not listed get engines of their own.
        args: deployment settings (address, API key, supervision periods, ...).

    Raises:
        GenRMConfigError: no instance, or engines for a route_key that is not an instance.
    """
    if not instances:
        raise GenRMConfigError("GenRM service: no instance configured (nothing to serve)")
    args = args or ServeArgs()
    for key, spec in instances.items():
        if key != spec.route_key:
            raise GenRMConfigError(
                f"instance key {key!r} != its spec's route_key {spec.route_key!r}"
            )
    # An engine the service re-creates gets a name, as the ones it creates do: other ingress
    # replicas find it by that name.
    refs = {
        key: [
            dataclasses.replace(r, create_name=engine_actor_name(args.app_name, key, i))
            if r.recreatable and r.create_name is None
            else r
            for i, r in enumerate(items)
        ]
        for key, items in normalize_engines(instances, engines).items()
    }
    deployment = cast(Any, GenRMIngress).options(
        num_replicas=args.ingress_replicas,
        max_ongoing_requests=_max_ongoing(instances, args),
        max_queued_requests=-1,
        ray_actor_options={"num_cpus": args.ingress_num_cpus},
        health_check_period_s=limits.SERVE_HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=limits.SERVE_HEALTH_CHECK_TIMEOUT_S,
        graceful_shutdown_timeout_s=limits.SERVE_GRACEFUL_SHUTDOWN_TIMEOUT_S,
    )
    app: Application = deployment.bind(dict(instances), refs, args)
    return app


def deploy(
    app: Application,
    args: ServeArgs | None = None,
    *,
    timeout_s: float | None = None,
    progress: Callable[[float, str], None] | None = None,
    progress_every_s: float = limits.PROGRESS_EVERY_S,
) -> DeploymentHandle[Any]:
    """Start Serve's HTTP proxy on ``args.host:args.port`` (if not up) and run the app.

    Ray must be initialised (``ray.init``) by the caller. Without ``timeout_s`` this waits as
    ``serve.run`` does: until the app runs, however long. With it, the wait for the ingress
    replicas to be scheduled and constructed ends with ``TimeoutError`` (Serve's own word on
    what it waits for, e.g. the resources a replica asks for) past ``timeout_s``, or at once
    with ``RuntimeError`` when the deploy failed; ``progress(elapsed_s, serve_status_message)``
    is called every ``progress_every_s`` meanwhile.
    """
    args = args or ServeArgs()
    refuse_another_serve(args.port)
    _start_serve(args.host, args.port)
    if timeout_s is None:
        return serve.run(app, name=args.app_name, route_prefix=args.route_prefix)
    handle = serve._run(  # serve.run without its unbounded wait for RUNNING
        app, _blocking=False, name=args.app_name, route_prefix=args.route_prefix
    )
    _wait_running(args.app_name, timeout_s, progress, progress_every_s)
    return handle


def _app_status(name: str) -> tuple[str, str]:
    """The app's status and Serve's messages on it and its deployments (what they wait for)."""
    app = serve.status().applications.get(name)
    if app is None:
        return "NOT_STARTED", ""
    words = [app.message] + [f"{d}: {o.message}" for d, o in app.deployments.items() if o.message]
    return str(app.status.value), "; ".join(w for w in words if w)


def _wait_running(
    name: str,
    timeout_s: float,
    progress: Callable[[float, str], None] | None,
    every_s: float,
) -> None:
    start = time.monotonic()
    next_word = start + every_s
    while True:
        status, words = _app_status(name)
        if status == "RUNNING":
            return
        waited = time.monotonic() - start
        if status == "DEPLOY_FAILED":
            raise RuntimeError(f"Serve app {name!r}: deploy failed: {words}")
        if waited >= timeout_s:
            raise TimeoutError(
                f"Serve app {name!r} not running after {waited:.0f} s (status {status}): "
                f"{words or 'Serve gives no reason'}"
            )
        if time.monotonic() >= next_word:
            word = f"{status}: {words}" if words else status
            if progress is not None:
                progress(waited, word)
            else:
                logger.info("waiting for Serve app %r: %s", name, word)
            next_word = time.monotonic() + every_s
        time.sleep(limits.HEALTH_POLL_S)


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` nothing listens on right now (only while asked: :func:`start_proxy`)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_proxy(host: str = "127.0.0.1", port: int | None = None) -> int:
    """Start Serve's HTTP proxy on ``host:port``, or on a free port when ``port`` is ``None``;
    returns the port. Ray must be initialised by the caller.

    A free port is free only when asked: another process (a busy machine starts many) may take
    it before the proxy, a Ray process of its own, binds it ("Failed to bind to address"). Then
    another free port is tried, up to :data:`limits.FREE_PORT_ATTEMPTS` times. A port the caller
    chose is theirs to fix, so its bind error is raised. :func:`deploy` with the same host and
    port then connects to this proxy.
    """
    refuse_another_serve(port)
    for attempt in range(1, limits.FREE_PORT_ATTEMPTS + 1):
        chosen = free_port(host) if port is None else port
        try:
            _start_serve(host, chosen)
            return chosen
        except Exception as err:
            if port is not None or "bind" not in str(err).lower():
                raise
            if attempt == limits.FREE_PORT_ATTEMPTS:
                raise
            logger.warning("port %d was taken before Serve's proxy bound it: another", chosen)
            serve.shutdown()  # type: ignore[no-untyped-call]
    raise AssertionError("unreachable")


class ServeRunningError(RuntimeError):
    """Serve already runs on the cluster, its HTTP proxy on another port than the one asked."""


def _running_serve_port() -> int | None:
    """The HTTP port of the Serve that runs on the cluster, or None where none runs."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return None
    try:
        options: Any = ray.get(controller.get_http_config.remote(), timeout=limits.SERVE_PORT_ASK_S)
    except Exception:  # a controller on its way out: serve.start meets it as before
        logger.debug("the running Serve did not say its HTTP port", exc_info=True)
        return None
    return int(options.port)


def refuse_another_serve(port: int | None) -> None:
    """Refuse a start on a cluster whose Serve proxies on another port (any, for a free one).

    ``serve.start`` on a running Serve keeps that Serve's proxy and ignores the port asked,
    without an error: the service would answer on a port nothing listens on, and its shutdown
    would take the other Serve's applications down with it."""
    running = _running_serve_port()
    if running is None or running == port:
        return
    raise ServeRunningError(
        f"Ray Serve already runs on this cluster, its HTTP proxy on port {running}: the judge "
        f"service starts a Serve of its own{'' if port is None else f' on port {port}'}; shut "
        "that one down (`serve shutdown`) or use another cluster"
    )


def _start_serve(host: str, port: int) -> None:
    """``serve.start``, past a first HTTP proxy that Serve itself replaced.

    Serve's controller declares a proxy unhealthy when it is not ready within a few seconds of
    its creation (``RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S``), kills it and starts another with a
    longer wait, while ``serve.start`` waits on the first one only and raises. A node that is
    busy starting other processes (a training job's engines and trainer) is that slow: seen as
    "ProxyActor ... killed by ray.kill ... never ran". The controller lives on with the new
    proxy under way, so starting again connects to it, and ``wait_until_healthy`` waits for its
    HTTP answer.
    """
    import ray

    for attempt in range(1, limits.PROXY_START_ATTEMPTS + 1):
        try:
            serve.start(http_options={"host": host, "port": port})
            return
        except ray.exceptions.ActorDiedError:  # the proxy (a dead controller is made anew)
            if attempt == limits.PROXY_START_ATTEMPTS:
                raise
            logger.warning("Serve replaced an HTTP proxy that was slow to start; connecting again")


def serve_namespace() -> str:
    """The Ray namespace of Serve's own actors (controller, proxies, replicas): Serve's
    controller schedules them by its own policy (a proxy follows a replica to its node), so a
    caller's check of its own actors leaves them to Serve."""
    from ray.serve._private.constants import SERVE_NAMESPACE

    return SERVE_NAMESPACE


def shutdown_serve(timeout_s: float = limits.SERVE_GONE_WAIT_S) -> None:
    """Shut Serve down, quietly, and wait until its controller is really gone.

    ``serve.shutdown()`` asks the controller for ``graceful_shutdown`` and waits on that call,
    which by Serve's design never returns: the controller ends by killing itself
    (``ray.kill``), and the call fails. Ray then prints "Task ServeController.graceful_shutdown
    failed ... killed by ray.kill" on every normal exit. Here the controller is told to shut
    down without the caller waiting on that call (``wait=False``, which returns at once); the
    wait is ours, on the controller's name, bounded by ``timeout_s``.

    Waiting matters as much: ``serve.shutdown()`` gives up after 30 s on a busy machine, while
    the controller goes on shutting down. A run that starts Serve next on the same cluster then
    meets that controller, which kills the new HTTP proxy (same name) as it finishes: seen as a
    job whose ``serve.start`` failed with "ProxyActor ... killed by ray.kill", and the job after
    it waiting for health forever.
    """
    import ray
    from ray.serve import context
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    def controller() -> Any:
        try:
            return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        except ValueError:
            return None

    client = context._global_client
    if client is not None:
        client.shutdown_cached_handles()  # type: ignore[no-untyped-call]
    handle = controller()
    if handle is not None:
        try:
            ray.get(handle.graceful_shutdown.remote(wait=False), timeout=timeout_s)
        except Exception:  # an older or stuck controller: Serve's own shutdown, noise and all
            logger.debug("graceful_shutdown(wait=False) failed; serve.shutdown()", exc_info=True)
            serve.shutdown()  # type: ignore[no-untyped-call]
    # the cached client would ask the dead controller whether it is alive
    context._disconnect()  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if controller() is None:
            return
        time.sleep(limits.HEALTH_POLL_S)
    logger.warning("Serve's controller is still shutting down after %.0f s", timeout_s)


class EngineStartError(RuntimeError):
    """An engine's start failed again after a re-creation: the service will not come up."""


def _failed_engines(body: object) -> str | None:
    """The health body's word on engines the service gave up on, if any."""
    instances = body.get("instances") if isinstance(body, dict) else None
    if not isinstance(instances, dict):
        return None
    failed = [
        f"{key}: {h.get('detail')}"
        for key, h in instances.items()
        if isinstance(h, dict) and h.get("engines_failed")
    ]
    return "; ".join(failed) or None


def wait_until_healthy(
    args: ServeArgs,
    timeout_s: float,
    *,
    poll_s: float = limits.HEALTH_POLL_S,
    log_every_s: float = limits.PROGRESS_EVERY_S,
    unreachable_s: float = limits.SERVE_UNREACHABLE_S,
    progress: Callable[[float, object], None] | None = None,
    stop: threading.Event | None = None,
) -> dict[str, object]:
    """Poll ``GET /health`` until 200; report what is still starting; raise ``TimeoutError``
    at ``timeout_s``, or once nothing has answered for ``unreachable_s`` (a 503 while the
    engines load is an answer; a refused connection is not), and ``EngineStartError`` at once
    when an engine failed to start again after its re-creation (it would fail every time).

    ``progress(elapsed_s, last_health_body)`` is called after every poll (the CLI draws one
    updating line from it); without it, one INFO line every ``log_every_s``. ``stop``, when
    set, ends the wait with ``TimeoutError`` at the next poll (a caller in another thread was
    cancelled: Ctrl-C must not wait for the deadline).
    """
    start = time.monotonic()
    deadline = start + timeout_s
    next_log = start + log_every_s
    answered = start  # the last time the HTTP proxy answered at all
    last: object = None
    with httpx.Client(timeout=limits.HEALTH_POLL_TIMEOUT_S) as client:
        while True:
            try:
                r = client.get(f"{args.url}/health")
                answered = time.monotonic()
                last = r.json()
                if r.status_code == 200:
                    return dict(r.json())
            except (httpx.HTTPError, ValueError) as err:
                last = repr(err)
            failed = _failed_engines(last)
            if failed:
                raise EngineStartError(f"GenRM service cannot start: {failed}")
            if stop is not None and stop.is_set():
                raise TimeoutError("GenRM service: stopped waiting for the engines (cancelled)")
            now = time.monotonic()
            if now - answered >= unreachable_s:
                raise TimeoutError(
                    f"GenRM service: nothing answers at {args.url}/health since "
                    f"{now - answered:.0f} s (more than {unreachable_s:g} s: Serve's HTTP "
                    f"proxy is gone, not loading): {last}"
                )
            if now >= deadline:
                raise TimeoutError(f"GenRM service not healthy after {timeout_s}s: {last}")
            if progress is not None:
                progress(now - start, last)
            elif now >= next_log:
                logger.info("waiting for the GenRM engines: %s", last)
                next_log = now + log_every_s
            time.sleep(poll_s)
