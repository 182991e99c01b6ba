"""``genrm-serve``: run the judge service on its own, ask for its status, shut it down.

Configuration is validated completely before Ray starts: a bad flag or config file prints the
parser's message and exits 2 within a second, instead of after a cluster start-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from genrm_serve.capacity import (
    CapacityError,
    check_service_fits,
    cluster_capacity,
)
from genrm_serve.config import (
    ENGINE_KINDS,
    GenRMConfigError,
    InstanceSpec,
    add_genrm_args,
    build_instances,
    instances_from_args,
    invalid_json,
)
from genrm_serve.limits import (
    ENGINE_START_TIMEOUT_S,
    PROGRESS_EVERY_S,
    SHUTDOWN_WAIT_S,
    STATUS_TIMEOUT_S,
    TEARDOWN_TIMEOUT_S,
)
from genrm_serve.preflight import InstanceFileError, check_instance_files
from genrm_serve.ray_env import apply_ray_env_defaults
from genrm_serve.serve_args import (
    DEFAULT_APP_NAME,
    DEFAULT_PORT,
    DEFAULT_ROUTE_PREFIX,
    ServeArgs,
    is_loopback,
)

__all__ = ["build_parser", "load_config_file", "main"]

logger = logging.getLogger("genrm_serve")

_FILE_KEYS = {
    "instances": "{route_key: {model_path, num_gpus, ...}} as for --genrm-instances",
    "model_path": "legacy single instance, as --genrm-model-path",
    "num_gpus": "as --genrm-num-gpus",
    "num_gpus_per_engine": "as --genrm-num-gpus-per-engine",
    "engine_config": "as --genrm-engine-config",
    "sampling_config": "as --genrm-sampling-config",
    "engine": f"default engine kind, one of {list(ENGINE_KINDS)}",
}

_EXAMPLES = f"""\
examples:
  # one judge (the legacy flags; route_key "__default__"), embedded Gemma model on CPU
  genrm-serve run --genrm-model-path embedded --genrm-num-gpus 1

  # two judges on one service
  genrm-serve run --genrm-instances '{{
      "quality": {{"model_path": "embedded", "num_gpus": 1}},
      "safety":  {{"model_path": "embedded", "num_gpus": 1,
                  "sampling_config": {{"temperature": 0.0}}}}}}'

  # the same from a file (JSON or YAML with the keys: {", ".join(_FILE_KEYS)})
  genrm-serve run --config judges.yaml --port 8000 --api-key "$GENRM_API_KEY"

  genrm-serve status            # health of the running service
  genrm-serve shutdown          # delete the app from the Ray cluster
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="genrm-serve",
        description="GenRM judge service: LLM judges on Ray Serve, routed by route_key.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,status,shutdown}")

    run = sub.add_parser(
        "run",
        help="deploy the service and stay up until interrupted",
        description="Start Ray (or join $RAY_ADDRESS), deploy the judge instances, print the "
        "URL and stay up until Ctrl-C (which shuts the service down).",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_genrm_args(run)
    run.add_argument(
        "--config",
        type=Path,
        default=None,
        help="JSON or YAML file with the instances (instead of the --genrm-* flags)",
    )
    _address_args(run)
    run.add_argument(
        "--api-key",
        default=None,
        help="bearer token clients must send (default: $GENRM_API_KEY; unset = no auth)",
    )
    run.add_argument(
        "--allow-remote-control",
        action="store_true",
        help="without an API key, let callers on other machines use /sleep and /wake_up too "
        "(by default only local callers may)",
    )
    run.add_argument(
        "--engine-num-cpus", type=float, default=1.0, help="CPUs reserved per engine actor"
    )
    run.add_argument(
        "--ingress-replicas",
        type=int,
        default=1,
        help="HTTP ingress replicas (default 1); more serve more concurrent single requests",
    )
    run.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs of the local Ray (when starting one)"
    )
    run.add_argument(
        "--dashboard",
        action="store_true",
        help="start Ray's dashboard with the local Ray (off by default: ~0.4 GB)",
    )
    run.add_argument(
        "--ready-timeout",
        type=float,
        default=ENGINE_START_TIMEOUT_S,
        help="seconds to wait for every engine to be healthy before giving up "
        f"(default {ENGINE_START_TIMEOUT_S:g})",
    )

    run.set_defaults(parser=run)

    status = sub.add_parser("status", help="print the service's health and engines")
    _address_args(status)
    status.add_argument("--api-key", default=None, help="bearer token (default $GENRM_API_KEY)")

    shutdown = sub.add_parser("shutdown", help="delete the service from the Ray cluster")
    shutdown.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join (default: $RAY_ADDRESS, else the local cluster)",
    )
    shutdown.add_argument("--app-name", default=DEFAULT_APP_NAME, help="Serve app name")
    return parser


def _address_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP port (default 8000)")
    p.add_argument("--route-prefix", default=DEFAULT_ROUTE_PREFIX, help="default /genrm")
    p.add_argument("--app-name", default=DEFAULT_APP_NAME, help="Serve app name (default genrm)")


def load_config_file(path: Path) -> dict[str, InstanceSpec]:
    """Instances from a JSON or YAML file; every mistake is a ``GenRMConfigError``."""
    try:
        text = path.read_text()
    except OSError as err:
        raise GenRMConfigError(f"--config {path}: cannot read: {err.strerror}") from err
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data: Any = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise GenRMConfigError(f"--config {path}: invalid YAML: {err}") from err
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise GenRMConfigError(f"--config {path}: {invalid_json(err)}") from err
    if not isinstance(data, dict):
        raise GenRMConfigError(f"--config {path}: must hold a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_FILE_KEYS))
    if unknown:
        raise GenRMConfigError(
            f"--config {path}: unknown key(s) {unknown}; allowed: {sorted(_FILE_KEYS)}"
        )
    instances = build_instances(
        instances=data.get("instances"),
        model_path=data.get("model_path"),
        num_gpus=data.get("num_gpus", 1),
        num_gpus_per_engine=data.get("num_gpus_per_engine", 1),
        engine_config=data.get("engine_config"),
        sampling_config=data.get("sampling_config"),
        engine=data.get("engine", "auto"),
    )
    if not instances:
        raise GenRMConfigError(f"--config {path}: configures no instance (give 'instances')")
    return instances


def _resolve_run(
    parser: argparse.ArgumentParser, ns: argparse.Namespace
) -> tuple[dict[str, InstanceSpec], ServeArgs]:
    flags_given = ns.genrm_instances is not None or ns.genrm_model_path is not None
    try:
        if ns.config is not None:
            if flags_given:
                raise GenRMConfigError(
                    "give the instances either with --config or with --genrm-instances / "
                    "--genrm-model-path, not both"
                )
            instances = load_config_file(ns.config)
        else:
            instances = instances_from_args(ns)
            if not instances:
                raise GenRMConfigError(
                    "no judge configured: give --genrm-instances, --genrm-model-path or --config"
                )
        args = ServeArgs(
            host=ns.host,
            port=ns.port,
            route_prefix=ns.route_prefix,
            app_name=ns.app_name,
            api_key=ns.api_key or os.environ.get("GENRM_API_KEY") or None,
            engine_num_cpus=ns.engine_num_cpus,
            ingress_replicas=ns.ingress_replicas,
            allow_remote_control=ns.allow_remote_control,
        )
    except GenRMConfigError as err:
        parser.error(str(err))
    except ValueError as err:  # pydantic's ValidationError of ServeArgs
        parser.error(str(err))
    try:  # what the instances point to, on disk: refused before Ray starts
        check_instance_files(instances)
    except InstanceFileError as err:
        print(f"genrm-serve run: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    return instances, args


def exposure_warning(args: ServeArgs) -> str | None:
    """What a service listening beyond this machine without an API key exposes, or None.

    A warning, not a refusal: a judge on a private cluster network, reached by the trainer on
    another node, is a normal setup. What an unauthenticated caller could do beyond asking for
    judgements (put the judges to sleep or wake them) stays refused to remote callers unless
    ``--allow-remote-control``."""
    if args.api_key or is_loopback(args.host):
        return None
    control = (
        "any caller can also put the judges to sleep or wake them (--allow-remote-control)"
        if args.allow_remote_control
        else "/sleep and /wake_up stay refused to callers on other machines"
    )
    return (
        f"listening on {args.host}:{args.port} without an API key: anyone who can reach that "
        f"port can use the judges and their GPUs ({control}). Set GENRM_API_KEY (or --api-key) "
        "to require 'Authorization: Bearer <key>', or listen on 127.0.0.1"
    )


def _init_ray(address: str | None, num_cpus: int | None = None, dashboard: bool = False) -> bool:
    """Join ``address`` (or ``$RAY_ADDRESS``), else start a local Ray; True when it started one."""
    apply_ray_env_defaults()
    import ray

    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, namespace="genrm")
        return False
    ray.init(address="local", num_cpus=num_cpus, namespace="genrm", include_dashboard=dashboard)
    return True


class _Stop(BaseException):
    """Raised in the main thread by SIGTERM (SIGINT raises ``KeyboardInterrupt``)."""


def _raise_stop(signum: int, _frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


def _ignore_signal(signum: int, _frame: Any) -> None:
    print(f"{signal.Signals(signum).name}: already shutting down", file=sys.stderr, flush=True)


def _check_capacity(instances: dict[str, InstanceSpec], args: ServeArgs) -> None:
    """Exit early (``CapacityError``) when the instances can never be placed on this cluster."""
    total, node_max = cluster_capacity()
    check_service_fits(instances, args, total, node_max)


class _HealthProgress:
    """One progress line while the engines load: redrawn in place on a terminal, else one
    line every ``PROGRESS_EVERY_S`` (a log file gets a heartbeat, not every poll)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.next_line = PROGRESS_EVERY_S
        self.drawn = False

    @staticmethod
    def describe(body: object) -> str:
        if isinstance(body, dict) and isinstance(body.get("instances"), dict):
            parts = []
            for key, h in body["instances"].items():
                if not isinstance(h, dict):
                    continue
                count = ""
                if "engines_total" in h:
                    count = f" {h.get('engines_healthy', 0)}/{h['engines_total']} engines"
                detail = f" [{h['detail']}]" if h.get("detail") else ""
                parts.append(f"{key}: {h.get('status')}{count}{detail}")
            return "; ".join(parts)
        return str(body)

    def __call__(self, elapsed_s: float, body: object) -> None:
        line = f"waiting for the engines ({elapsed_s:.0f}s): {self.describe(body)}"
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r" + line[:width] + "\x1b[K")
            self.stream.flush()
            self.drawn = True
        elif elapsed_s >= self.next_line:
            print(line, file=self.stream, flush=True)
            self.next_line = elapsed_s + PROGRESS_EVERY_S

    def done(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def _teardown(args: ServeArgs, started_ray: bool, deployed: bool) -> None:
    """Delete the deployment (bounded), then stop the Ray instance this process started.

    Not ``deployed`` (refused before the deploy): another Serve's app of the same name is not
    ours to delete."""
    import ray

    if not ray.is_initialized():
        return
    if not deployed and not started_ray:
        ray.shutdown()  # this process's connection only
        return
    print("shutting down ...", flush=True)
    from ray import serve

    from genrm_serve.app import shutdown_serve

    def delete() -> None:
        try:
            if started_ray:
                shutdown_serve(TEARDOWN_TIMEOUT_S)
            else:  # someone else's cluster: remove only our app
                serve.delete(args.app_name)
        except Exception as err:
            print(f"deleting the Serve app failed: {err}", file=sys.stderr)

    worker = threading.Thread(target=delete, name="genrm-teardown", daemon=True)
    worker.start()
    worker.join(TEARDOWN_TIMEOUT_S)
    if worker.is_alive():
        print(
            f"the Serve app was not deleted within {TEARDOWN_TIMEOUT_S:g}s; stopping Ray anyway",
            file=sys.stderr,
        )
    ray.shutdown()


def _cmd_run(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    instances, args = _resolve_run(parser, ns)
    warning = exposure_warning(args)
    if warning:
        print(f"genrm-serve run: warning: {warning}", file=sys.stderr, flush=True)
    # From here on SIGINT and SIGTERM end the command at any moment (Ray start-up, the wait
    # for health, serving) and the finally below tears down what was started.
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started_ray = False
    deployed = False
    code = 0
    try:
        started_ray = _init_ray(None, ns.num_cpus, ns.dashboard)
        signal.signal(signal.SIGTERM, _raise_stop)  # ray.init installed its own (sys.exit)
        from ray import serve

        from genrm_serve.app import (
            EngineStartError,
            ServeRunningError,
            build_app,
            deploy,
            wait_until_healthy,
        )

        try:
            _check_capacity(instances, args)
        except CapacityError as err:
            print(f"genrm-serve run: error: {err}", file=sys.stderr, flush=True)
            return 2
        deployed = True  # a deploy cut short is ours to delete too
        try:
            deploy(build_app(instances, args=args), args)
        except ServeRunningError as err:  # refused before Serve was touched
            deployed = False
            print(f"genrm-serve run: error: {err}", file=sys.stderr, flush=True)
            return 2
        print(f"GenRM service deployed at {args.url} (instances: {', '.join(instances)})")
        print("waiting for the engines to load ...", flush=True)
        progress = _HealthProgress(sys.stderr)
        try:
            report = wait_until_healthy(args, ns.ready_timeout, progress=progress)
        except (TimeoutError, EngineStartError) as err:
            progress.done()
            print(f"error: {err}", file=sys.stderr)
            return 1
        progress.done()
        print(f"ready: {json.dumps(report)}")
        print(f"  curl {args.url}/health")
        print(f"  OpenAI base_url: {args.url}/v1  (model = route_key)")
        import ray

        gcs = ray.get_runtime_context().gcs_address
        print(f"  genrm-serve shutdown --address {gcs}   (or Ctrl-C here)")
        print("Ctrl-C to stop.", flush=True)
        while True:
            time.sleep(1.0)
            if args.app_name not in serve.status().applications:
                print("the service was shut down from elsewhere; exiting")
                return 0
    except (KeyboardInterrupt, _Stop) as stop:
        # a KeyboardInterrupt's text is empty (or Ray's "()"): name the signal itself
        name = str(stop) if isinstance(stop, _Stop) else "SIGINT"
        print(f"\nstopping ({name}) ...", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, _ignore_signal)
        signal.signal(signal.SIGINT, _ignore_signal)
        _teardown(args, started_ray, deployed)
    return code


def _cmd_status(ns: argparse.Namespace) -> int:
    import httpx

    args = ServeArgs(host=ns.host, port=ns.port, route_prefix=ns.route_prefix, api_key=None)
    key = ns.api_key or os.environ.get("GENRM_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(timeout=STATUS_TIMEOUT_S, headers=headers) as client:
            health = client.get(f"{args.url}/health")
            engines = client.get(f"{args.url}/engines")
    except httpx.HTTPError as err:
        print(f"GenRM service at {args.url}: unreachable ({err})")
        return 3
    print(f"GenRM service at {args.url}: HTTP {health.status_code}")
    try:
        print(json.dumps(health.json(), indent=2))
    except ValueError:  # not the service's JSON (another server on that port, a proxy page)
        print(health.text[:500])
    if engines.status_code == 200:
        for key_, slots in engines.json()["instances"].items():
            for s in slots:
                extra = f" ({s['detail']})" if s.get("detail") else ""
                print(
                    f"  {key_:<16} {s['engine_id']:<24} {s['state']:<10} "
                    f"in_flight={s['in_flight']} restarts={s['restarts']}{extra}"
                )
    elif engines.status_code == 401:  # never silently without the table
        how = "this key was refused" if key else "set GENRM_API_KEY or pass --api-key"
        print(f"engines: not shown: the service wants its API key (HTTP 401; {how})")
    else:
        print(f"engines: not shown: GET {args.url}/engines answered HTTP {engines.status_code}")
    return 0 if health.status_code == 200 else 1


def _cmd_shutdown(ns: argparse.Namespace) -> int:
    address = ns.address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        _init_ray(address)
    except ConnectionError as err:  # no cluster there: a user's mistake, not a traceback
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(
            f"genrm-serve shutdown: no Ray cluster to join at {address} ({reason}); nothing "
            "was shut down (give the cluster of the `genrm-serve run` with --address)",
            file=sys.stderr,
        )
        return 1
    from ray import serve

    apps = serve.status().applications
    if ns.app_name not in apps:
        print(f"no Serve app named {ns.app_name!r} (apps: {sorted(apps)})")
        return 1
    # Not blocking: the `genrm-serve run` that owns the cluster exits (and stops Ray) as soon
    # as the app is gone, which would cut a blocking delete off mid-wait.
    serve.delete(ns.app_name, _blocking=False)
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    while time.monotonic() < deadline:
        try:
            if ns.app_name not in serve.status().applications:
                break
        except Exception:  # the cluster went away with its `run` process: deleted too
            break
        time.sleep(0.5)
    else:
        print(
            f"Serve app {ns.app_name!r} still deleting after {SHUTDOWN_WAIT_S:g} s",
            file=sys.stderr,
        )
        return 1
    print(f"deleted Serve app {ns.app_name!r}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every request at INFO: the health polls would print twice a second.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "run":
        return _cmd_run(ns.parser, ns)
    if ns.command == "status":
        return _cmd_status(ns)
    return _cmd_shutdown(ns)


if __name__ == "__main__":
    sys.exit(main())
