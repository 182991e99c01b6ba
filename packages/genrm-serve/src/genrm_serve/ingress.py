"""The HTTP face of the service: FastAPI routes under ``/genrm`` on one Ray Serve replica.

The ingress maps a route_key to its instance (404 for an unknown key, naming the registered
ones), asks the instance's router for an engine, and turns every failure into one status with an
``ErrorBody``. It only ever awaits engine actors (no blocking ``ray.get``), so one replica serves
thousands of concurrent requests; that is why Serve's ``max_ongoing_requests`` is set high and
admission control is done per instance here instead (429 with Retry-After).

One replica by default; ``ServeArgs.ingress_replicas`` adds more when concurrent single requests
outrun one replica's Python (~1 ms of HTTP handling a request, serial on its event loop). Each
replica keeps its own routing state over all the engines, with an even share of every
instance's admission limits. The leader (rank 0) owns the engines' life: it creates and
re-creates them; the others find them by name. A sleep is then known from the engines (they
refuse while asleep, the probes report it), and ``/metrics`` adds up every replica's.

No ``from __future__ import annotations`` here: Serve's class-based FastAPI views read the
route methods' annotations at runtime, and string annotations turn every body into a query
parameter.
"""

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from ray import serve
from ray.serve.exceptions import RayServeException
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as Message_

from genrm_client.types import (
    DEFAULT_ROUTE_KEY,
    GenerateBatchRequest,
    GenerateMeta,
    GenerateRequest,
    Message,
    SamplingParams,
)
from genrm_serve.config import InstanceSpec
from genrm_serve.engine_refs import (
    EnginePlacement,
    EngineRef,
    engine_actor_name,
    follower_refs,
    instance_bundles,
    needs_gpus,
)
from genrm_serve.engines.base import EngineOutput, EngineRequest
from genrm_serve.errors import ServiceError, error_body, error_response
from genrm_serve.health import health_report
from genrm_serve.metrics import CONTENT_TYPE, ServiceMetrics
from genrm_serve.metrics_hub import MetricsPublisher
from genrm_serve.openai_compat import (
    ChatCompletionRequest,
    chat_completion_response,
    models_response,
)
from genrm_serve.router import EngineSlot, InstanceRouter
from genrm_serve.serve_args import CONTROL_PATHS, ServeArgs, is_loopback
from genrm_serve.supervisor import EngineSupervisor

__all__ = ["GenRMIngress", "fastapi_app"]

logger = logging.getLogger(__name__)


class _BearerAuth:
    """Pure ASGI middleware: every path but ``/health`` needs ``Authorization: Bearer <key>``.

    Runs before FastAPI reads the body, so an unauthenticated caller learns nothing, not even
    whether its body was well formed. The key lives on ``app.state`` (set by the ingress).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            key: str | None = getattr(scope["app"].state, "api_key", None)
            if not key and _remote_control_refused(scope):
                path = scope["path"].rstrip("/")
                response = error_response(
                    "forbidden",
                    f"{path} changes the service's state and the service has no API key: only "
                    "a caller on its own machine may call it. Start it with GENRM_API_KEY set "
                    "(callers send 'Authorization: Bearer <key>'), or with "
                    "--allow-remote-control",
                )
                await response(scope, receive, send)
                return
            if key and not scope["path"].rstrip("/").endswith("/health"):
                given = b""
                for name, value in scope["headers"]:
                    if name == b"authorization":
                        given = value
                        break
                if not hmac.compare_digest(given, b"Bearer " + key.encode()):
                    response = error_response(
                        "unauthorized",
                        "missing or wrong API key: send 'Authorization: Bearer <GENRM_API_KEY>'",
                        headers={"WWW-Authenticate": "Bearer"},
                    )
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _remote_control_refused(scope: Scope) -> bool:
    """A state-changing endpoint (``CONTROL_PATHS``) called from another machine, on a
    service without an API key and without ``allow_remote_control``."""
    if getattr(scope["app"].state, "allow_remote_control", False):
        return False
    if not scope["path"].rstrip("/").endswith(CONTROL_PATHS):
        return False
    client = scope.get("client")
    return not (client and is_loopback(str(client[0])))


class _BodyLimit:
    """Pure ASGI middleware: a body over ``app.state.max_body_bytes`` is answered 413 unread.

    A ``Content-Length`` over the limit is refused before a byte is read; a body without one
    (chunked) is counted as it streams and refused as soon as it passes the limit. Either way
    nothing is parsed, and the ingress never holds more than the limit of one body. The body
    read here is handed on to the app as one message.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit: int | None = getattr(scope["app"].state, "max_body_bytes", None)
        if scope["type"] != "http" or not limit:
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await self._refuse(int(value), limit, scope, receive, send)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._refuse(size, limit, scope, receive, send, at_least=True)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    @staticmethod
    async def _refuse(
        size: int,
        limit: int,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        at_least: bool = False,
    ) -> None:
        response = error_response(
            "request_too_large",
            f"request body of {'more than ' if at_least else ''}{size} bytes is over the "
            f"limit max_request_body_bytes={limit}; send fewer or shorter requests per call",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


def _replay(messages: list[Message_], receive: Receive) -> Receive:
    """A ``receive`` that yields ``messages`` first, then reads on (e.g. a later disconnect)."""
    pending = list(messages)

    async def replayed() -> Message_:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


fastapi_app = FastAPI(
    title="GenRM judge service",
    description="LLM judges on Ray Serve, routed by route_key.",
)
# Starlette runs the last added outermost: auth first, then the body limit.
fastapi_app.add_middleware(_BodyLimit)
fastapi_app.add_middleware(_BearerAuth)


@fastapi_app.exception_handler(ServiceError)
async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
    return error_response(
        exc.type,
        exc.message,
        headers=exc.headers(),
        route_key=exc.route_key,
        registered_route_keys=exc.registered_route_keys,
    )


def _describe_validation(errors: list[Any]) -> str:
    parts = []
    for e in errors[:10]:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        given = repr(e.get("input"))
        if len(given) > 80:
            given = given[:77] + "..."
        parts.append(f"{loc}: {e.get('msg')} (got {given})")
    more = f"; and {len(errors) - 10} more" if len(errors) > 10 else ""
    return "invalid request: " + "; ".join(parts) + more


@fastapi_app.exception_handler(RequestValidationError)
async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response("invalid_request", _describe_validation(list(exc.errors())))


@fastapi_app.exception_handler(StarletteHTTPException)
async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    if kind is not None:
        return error_response(kind, str(exc.detail))
    body = error_body("http_error", str(exc.detail))  # Starlette's own status, whatever it is
    return JSONResponse(body.model_dump(exclude_none=True), status_code=exc.status_code)


class SleepWakeRequest(BaseModel):
    """Optional body of ``/sleep`` and ``/wake_up``: one instance, or (absent) all."""

    model_config = ConfigDict(extra="forbid")

    route_key: str | None = None


def _sampling(base: SamplingParams, override: SamplingParams | None) -> SamplingParams:
    """Request-level sampling over the instance's; ``chat_template_kwargs`` merge key by key."""
    if override is None:
        return base
    merged = override.merged_over(base)
    if override.chat_template_kwargs is not None and base.chat_template_kwargs:
        merged = merged.model_copy(
            update={
                "chat_template_kwargs": {
                    **base.chat_template_kwargs,
                    **override.chat_template_kwargs,
                }
            }
        )
    return merged


def _meta(router: InstanceRouter, slot: EngineSlot, out: EngineOutput) -> dict[str, Any]:
    # The engine's own claim of who it is wins: it proves where the request really went.
    meta = GenerateMeta(
        finish_reason=out.finish_reason,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        route_key=str(out.extra.get("route_key", router.route_key)),
        engine_id=str(out.extra.get("engine_id", slot.engine_id)),
        engine_latency_s=out.latency_s,
        verdict_prob=out.extra.get("verdict_prob"),
        cached_prompt_tokens=out.extra.get("cached_prompt_tokens"),
    )
    return meta.model_dump(exclude_none=True)


def _replica_rank() -> int:
    """This replica's rank among the ingress replicas (0, the leader, outside Serve)."""
    try:
        return int(serve.get_replica_context().rank.rank)
    except RayServeException:
        return 0


def _standalone_names(spec: InstanceSpec, args: ServeArgs) -> list[EngineRef]:
    """The engines the leader creates for a standalone instance, by the names it gives them."""
    return [
        EngineRef(name=engine_actor_name(args.app_name, spec.route_key, i), reattach=True)
        for i in range(spec.num_engines)
    ]


def _outcome(err: ServiceError) -> str:
    known = {"prompt_too_long", "overloaded", "engine_unavailable", "instance_asleep", "timeout"}
    return err.type if err.type in known else "error"


@serve.deployment(name="GenRMIngress")
@serve.ingress(fastapi_app)
class GenRMIngress:
    """The Serve deployment: routes, routers per instance, the engine supervisor."""

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        instances: Mapping[str, InstanceSpec],
        engines: Mapping[str, list[EngineRef]],
        args: ServeArgs,
    ) -> None:
        if not instances:
            raise ValueError("GenRM service needs at least one instance")
        self.args = args
        self.created = int(time.time())
        fastapi_app.state.api_key = args.api_key
        fastapi_app.state.allow_remote_control = args.allow_remote_control
        fastapi_app.state.max_body_bytes = args.max_request_body_bytes
        self.prom = ServiceMetrics()
        self.prom.prime(list(instances))
        self._pgs: list[Any] = []
        replicas = args.ingress_replicas
        rank = _replica_rank()
        self.routers: dict[str, InstanceRouter] = {}
        # the supervisor tends the routers filled in below; a router tells it of a dead engine
        self.supervisor = EngineSupervisor(self.routers, args)
        for key, spec in instances.items():
            refs = engines.get(key) or (
                self._standalone_refs(spec) if rank == 0 else _standalone_names(spec, args)
            )
            if rank > 0:
                refs = follower_refs(refs)
            slots = [EngineSlot(route_key=key, index=i, ref=r) for i, r in enumerate(refs)]
            limit = args.engine_inflight_limit or 2 * spec.engine_config.max_batch_size
            self.routers[key] = InstanceRouter(
                spec,
                slots,
                inflight_limit=-(-limit // replicas),
                max_queued=-(-spec.engine_config.max_queued_requests // replicas),
                request_timeout_s=args.request_timeout_s,
                engines_shared=replicas > 1,
                on_engine_gone=self.supervisor.kick,
            )
        self.supervisor.start()
        self.publisher: MetricsPublisher | None = None
        if replicas > 1:
            self.publisher = MetricsPublisher(
                args.app_name, rank, lambda: self.prom.render(self.routers)
            )
            self.publisher.start()
        self.registered = sorted(self.routers)
        logger.info(
            "GenRM ingress up (replica %d of %d): instances %s", rank, replicas, self.registered
        )

    def _standalone_refs(self, spec: InstanceSpec) -> list[EngineRef]:
        from ray.util.placement_group import placement_group

        cluster_gpus = float(ray.cluster_resources().get("GPU", 0)) > 0  # type: ignore[no-untyped-call]
        with_gpus = needs_gpus(spec, cluster_gpus)
        bundles = instance_bundles(
            spec, with_gpus=with_gpus, engine_num_cpus=self.args.engine_num_cpus
        )
        pg = placement_group(
            bundles, strategy="PACK", name=f"genrm-{self.args.app_name}-{spec.route_key}"
        )
        self._pgs.append(pg)
        gpus = float(spec.num_gpus_per_engine) if with_gpus else 0.0
        return [
            EngineRef(
                placement=EnginePlacement(
                    placement_group=pg,
                    bundle_index=i,
                    num_gpus=gpus,
                    num_cpus=self.args.engine_num_cpus,
                ),
                create_name=engine_actor_name(self.args.app_name, spec.route_key, i),
            )
            for i in range(len(bundles))
        ]

    def check_health(self) -> None:
        """Serve's replica probe: only the supervisor must be running; engines are its job."""
        if not self.supervisor.alive:
            raise RuntimeError("the GenRM engine supervisor stopped")

    async def __del__(self) -> None:
        await self.supervisor.stop()
        if self.publisher is not None:
            await self.publisher.stop()
        for router in self.routers.values():
            for slot in router.slots:
                if slot.owned and slot.handle is not None:
                    try:
                        ray.kill(slot.handle, no_restart=True)
                    except Exception:  # already gone
                        logger.debug("engine %s already gone", slot.engine_id)
        from ray.util.placement_group import remove_placement_group

        for pg in self._pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                logger.debug("placement group already removed")

    # ---- helpers -------------------------------------------------------------------------

    def _router(self, route_key: str | None) -> InstanceRouter:
        if route_key is None:
            if DEFAULT_ROUTE_KEY in self.routers:
                return self.routers[DEFAULT_ROUTE_KEY]
            if len(self.routers) == 1:
                return next(iter(self.routers.values()))
            route_key = DEFAULT_ROUTE_KEY
        router = self.routers.get(route_key)
        if router is None:
            self.prom.unknown_route_key.inc()
            raise ServiceError.unknown_route_key(route_key, self.registered)
        return router

    def _engine_request(
        self,
        router: InstanceRouter,
        messages: list[Message],
        sampling: SamplingParams | None,
        *,
        field: str = "sampling_params.max_response_len",
        prefix_key: str | None = None,
    ) -> EngineRequest:
        asked = sampling.max_response_len if sampling is not None else None
        context = router.spec.engine_config.max_context_len
        if asked is not None and asked > context:
            raise ServiceError(
                "invalid_request",
                f"invalid request: {field}={asked} is over the instance's max_context_len="
                f"{context} (route_key={router.route_key}); ask for at most {context} tokens",
                route_key=router.route_key,
            )
        return EngineRequest(
            sampling=_sampling(router.spec.sampling_config, sampling),
            messages=messages,
            prefix_key=prefix_key,
        )

    async def _observed(
        self, router: InstanceRouter, call: Awaitable[tuple[EngineOutput, EngineSlot]]
    ) -> tuple[EngineOutput, EngineSlot]:
        start = time.monotonic()
        try:
            out, slot = await call
        except ServiceError as err:
            self.prom.observe(router.route_key, _outcome(err), time.monotonic() - start)
            raise
        except BaseException:
            self.prom.observe(router.route_key, "error", time.monotonic() - start)
            raise
        self.prom.observe(
            router.route_key,
            "success",
            time.monotonic() - start,
            out.prompt_tokens,
            out.completion_tokens,
        )
        return out, slot

    async def _target_keys(self, request: Request) -> list[str]:
        raw = await request.body()
        body = SleepWakeRequest()
        if raw.strip():
            try:
                body = SleepWakeRequest.model_validate(json.loads(raw))
            except (json.JSONDecodeError, ValidationError) as err:
                raise ServiceError("invalid_request", f"invalid request: {err}") from err
        key = body.route_key or request.query_params.get("route_key")
        if key is None:
            return list(self.routers)
        return [self._router(key).route_key]

    # ---- routes --------------------------------------------------------------------------

    @fastapi_app.post("/generate")
    async def generate(self, body: GenerateRequest) -> JSONResponse:
        """One judge request → ``{"response": text, "meta": {...}}``."""
        router = self._router(body.route_key)
        req = self._engine_request(
            router, body.messages, body.sampling_params, prefix_key=body.prefix_key
        )
        out, slot = await self._observed(router, router.generate(req))
        return JSONResponse({"response": out.text, "meta": _meta(router, slot, out)})

    @fastapi_app.post("/generate_batch")
    async def generate_batch(self, body: GenerateBatchRequest) -> JSONResponse:
        """Many independent requests → one result each, in order (a response or an error).

        A full queue refuses the whole batch (429, so the client retries it); an unknown
        route_key, an over-long prompt or an instance without engines fails only its items.
        """
        results: list[dict[str, Any] | None] = [None] * len(body.requests)
        groups: dict[str, list[tuple[int, EngineRequest]]] = {}
        for i, r in enumerate(body.requests):
            try:
                router = self._router(r.route_key)
                req = self._engine_request(
                    router,
                    r.messages,
                    r.sampling_params,
                    field=f"requests[{i}].sampling_params.max_response_len",
                    prefix_key=r.prefix_key,
                )
            except ServiceError as err:
                results[i] = err.body().model_dump(exclude_none=True)
                continue
            groups.setdefault(router.route_key, []).append((i, req))
        refused: dict[str, ServiceError] = {}
        for key, items in groups.items():
            try:
                self.routers[key].admit(len(items))
            except ServiceError as err:
                if err.status == 429:
                    for _ in items:
                        self.prom.observe(key, "overloaded", 0.0)
                    raise
                refused[key] = err

        async def run(key: str, items: list[tuple[int, EngineRequest]]) -> None:
            router = self.routers[key]
            start = time.monotonic()
            if key in refused:
                outs: list[Any] = [refused[key]] * len(items)
            else:
                outs = await router.generate_many([req for _, req in items])
            latency = time.monotonic() - start
            for (i, _), res in zip(items, outs, strict=True):
                if isinstance(res, ServiceError):
                    self.prom.observe(key, _outcome(res), latency)
                    results[i] = res.body().model_dump(exclude_none=True)
                else:
                    out, slot = res
                    self.prom.observe(
                        key, "success", latency, out.prompt_tokens, out.completion_tokens
                    )
                    results[i] = {"response": out.text, "meta": _meta(router, slot, out)}

        await asyncio.gather(*(run(k, v) for k, v in groups.items()))
        return JSONResponse({"results": results})

    @fastapi_app.get("/health")
    async def health(self) -> JSONResponse:
        """Cached engine state; never waits on an engine."""
        status, body = health_report(self.routers)
        return JSONResponse(body, status_code=status)

    @fastapi_app.get("/metrics")
    async def metrics(self) -> Response:
        """Prometheus text format, labelled by route_key; every replica's, added up."""
        if self.publisher is not None:
            return Response(await self.publisher.scrape(), media_type=CONTENT_TYPE)
        return Response(self.prom.render(self.routers), media_type=CONTENT_TYPE)

    @fastapi_app.get("/engines")
    async def engines(self) -> JSONResponse:
        """Every engine's state (for ``genrm-serve status`` and debugging)."""
        namespace = ray.get_runtime_context().namespace
        out = {
            key: [
                {
                    "engine_id": s.engine_id,
                    "state": s.state,
                    "detail": s.detail,
                    "in_flight": s.in_flight,
                    "restarts": s.restarts,
                    "actor_name": s.ref.create_name or s.ref.name,
                    "namespace": s.ref.namespace or namespace,
                }
                for s in router.slots
            ]
            for key, router in self.routers.items()
        }
        return JSONResponse({"instances": out})

    @fastapi_app.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest) -> JSONResponse:
        """OpenAI-compatible chat completion; ``model`` is the route_key."""
        router = self._router(body.model)
        req = self._engine_request(
            router, body.chat_messages(), body.sampling_params(), field="max_tokens"
        )
        out, _slot = await self._observed(router, router.generate(req))
        return JSONResponse(chat_completion_response(body.model, out))

    @fastapi_app.get("/v1/models")
    async def models(self) -> JSONResponse:
        """OpenAI-compatible model list: one model per route_key."""
        return JSONResponse(models_response(self.registered, self.created))

    @fastapi_app.post("/sleep")
    async def sleep(self, request: Request) -> JSONResponse:
        """Free the engines' memory (all instances, or ``{"route_key": ...}``)."""
        keys = await self._target_keys(request)
        await asyncio.gather(*(self.routers[k].sleep(self.args.sleep_timeout_s) for k in keys))
        return JSONResponse({"status": "asleep", "route_keys": keys})

    @fastapi_app.post("/wake_up")
    async def wake_up(self, request: Request) -> JSONResponse:
        """Restore the engines' memory and admit requests again."""
        keys = await self._target_keys(request)
        await asyncio.gather(*(self.routers[k].wake(self.args.sleep_timeout_s) for k in keys))
        return JSONResponse({"status": "awake", "route_keys": keys})
