"""aiohttp application: Triton's HTTP endpoints over the inference and control services."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, cast

import orjson
from aiohttp import hdrs, web

# The cause aiohttp gives the web.RequestPayloadError that request.read() raises for a body
# that does not decode as its headers say (tests/integration/test_hostile_input.py pins it).
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError

from appliance.common.access import Restrictions
from appliance.common.errors import ApplianceError, DecoupledOnUnary, InvalidInput
from appliance.common.header_forward import HeaderForward
from appliance.common.limits import RequestLimits
from appliance.common.types import InferRequest, InferResponse
from appliance.frontends import jsonconv
from appliance.frontends.http import convert
from appliance.frontends.http.codec import HttpInferRequest, decode_request, encode_response
from appliance.frontends.http.fastpath import (
    MIN_COMPRESSED_BYTES,
    STREAMED_BYTES,
    Body,
    Buffer,
    Reply,
    body_too_large,
)
from appliance.frontends.http.generate import decode_generate, encode_generate
from appliance.frontends.http.header_plans import HeaderPlans
from appliance.frontends.http.origins import RequestOrigins
from appliance.frontends.http.refusals import RefusedBodies
from appliance.frontends.http.relay import RelayHandler
from appliance.frontends.http.status_page import DATA_APIS, StatusPage
from appliance.frontends.status import HTTP_STATUS
from appliance.ops.logs import RATE_LIMITED
from appliance.services.control import ControlService
from appliance.services.inference import Admission, InferenceService, Prepared
from appliance.services.shared_memory import RequestHolds, SharedMemoryRegistry, TooManyRegions
from appliance.services.status import StatusService

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_JSON = "application/json"
# tritonserver's refusal of a decoupled model on /infer (our explanation follows it).
DECOUPLED_REFUSAL = "HTTP end point doesn't support models with decoupled transaction policy"
# The cap on registered shared memory regions (RESOURCE_EXHAUSTED, whose HTTP status is 413
# for bodies): 429, a limit the client reached, which unregistering regions lifts.
REGION_CAP_STATUS = 429


def _refusal_text(exc: ApplianceError) -> str:
    """An infer request's error as this route answers it: a decoupled model's refusal with
    tritonserver's words first."""
    if isinstance(exc, DecoupledOnUnary):
        return f"{DECOUPLED_REFUSAL}: {exc.message}"
    return exc.message


def error_response(status: int, message: str) -> web.Response:
    """Triton's error body, which tritonclient reads: {"error": "<message>"}."""
    try:
        body = orjson.dumps({"error": message})
    except TypeError:  # a message quoting a client's bytes that are not UTF-8 (found by fuzzing)
        body = orjson.dumps({"error": message.encode("utf-8", "backslashreplace").decode()})
    return web.Response(status=status, body=body, content_type=_JSON)


_READY_NOT_BOOL = "Invalid value for 'ready': expected a boolean"
_READY_NOT_SCALAR = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')


def _empty(status: int, content_type: str = "text/plain") -> web.Response:
    """An answer with no body, with the content type tritonserver gives it (text/plain on the
    health routes, application/json on the control routes)."""
    return web.Response(status=status, content_type=content_type)


def _path_pattern(path: str) -> re.Pattern[str]:
    """A route's path as a regular expression ({name} and {name:regex} parts)."""
    out = ""
    for literal, variable in re.findall(r"([^{]*)(\{[^}]*\})?", path):
        out += re.escape(literal)
        if variable:
            _, _, regex = variable[1:-1].partition(":")
            out += f"(?:{regex or '[^/]+'})"
    return re.compile(out)


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(value), content_type=_JSON)


# Request body encodings aiohttp decodes and tritonclient sends. aiohttp reads any other
# Content-Encoding as plain bytes, which would be wrong data: those are refused (415).
ACCEPTED_ENCODINGS = ("", "identity", "gzip", "deflate")


def _encoding_problem(headers: Mapping[str, str]) -> str:
    """'' when the body's Content-Encoding can be decoded, else why not."""
    encoding = headers.get(hdrs.CONTENT_ENCODING)
    if encoding is None or encoding.strip().lower() in ACCEPTED_ENCODINGS:
        return ""
    return (
        f"Content-Encoding '{encoding}' is not supported; send the request body as identity "
        "(uncompressed), gzip or deflate"
    )


def _payload_problem(request: web.Request, exc: web.RequestPayloadError) -> str:
    """What is wrong with a body aiohttp could not read: it does not decode as its
    Content-Encoding says, or its framing (chunks, length) is broken."""
    cause = exc.__cause__
    if isinstance(cause, ContentEncodingError):
        encoding = request.headers.get(hdrs.CONTENT_ENCODING, "")
        return f"request body is not valid {encoding} data, as its Content-Encoding says it is"
    reason = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
    return f"request body cannot be read: {str(reason).strip()}"


def _guard(
    handler: Handler,
    api: str | tuple[str, ...] = "",
    restrictions: Restrictions | None = None,
    origins: RequestOrigins | None = None,
    max_body_bytes: int = 0,
) -> Handler:
    """Refuse what a web page may not send (origins.py), check the API's restriction (every
    one of them, for an endpoint that shows what several APIs show), refuse a declared body
    over the limit before reading it, and turn every error into Triton's error body."""
    apis = (api,) if isinstance(api, str) else api
    control = "inference" not in apis

    async def guarded(request: web.Request) -> web.StreamResponse:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("HTTP request: %s %s", request.method, request.path)
        if origins is not None:
            headers = request.headers
            refused = origins.problem(
                request.method,
                headers.get(hdrs.HOST),
                headers.get(hdrs.ORIGIN),
                control and request.method == "POST",
                headers.get(hdrs.CONTENT_TYPE),
            )
            if refused is not None:
                return error_response(*refused)
        try:
            if restrictions:
                restrictions.check_all(apis, request.headers)
            length = request.content_length
            if max_body_bytes and length is not None and length > max_body_bytes:
                # aiohttp refuses it only once that much has been read: a client declaring
                # 1 TB and sending nothing held the request open until its body timer
                # (tests/security/test_cve_classes.py). aiohttp discards what follows.
                raise web.HTTPRequestEntityTooLarge(max_size=max_body_bytes, actual_size=length)
            problem = _encoding_problem(request.headers)
            if problem:
                return error_response(415, problem)
            return await handler(request)
        except ApplianceError as exc:
            return error_response(HTTP_STATUS[exc.code], exc.message)
        except web.HTTPRequestEntityTooLarge as exc:
            return error_response(413, body_too_large(str(exc.text).rstrip(".")))
        except web.HTTPException as exc:
            return error_response(exc.status, exc.reason)
        except web.RequestPayloadError as exc:
            return error_response(400, _payload_problem(request, exc))
        except Exception:
            # A server bug, but one a client may trigger at will: rate-limited (logs.py).
            log.exception(
                "unexpected error handling %s %s", request.method, request.path, extra=RATE_LIMITED
            )
            return error_response(500, "internal error; see the server log")

    return guarded




async def read_body(request: web.Request, max_bytes: int) -> bytes | bytearray:
    """The request body with one copy from the socket's chunks (aiohttp's read() makes three).

    Compressed or small bodies, or ones without Content-Length, take aiohttp's own path.
    """
    length = request.content_length
    if length is None or length < STREAMED_BYTES or "Content-Encoding" in request.headers:
        return await request.read()
    if length > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=length)
    body = bytearray(length)
    view = memoryview(body)
    filled = 0
    while chunk := await request.content.readany():
        end = filled + len(chunk)
        if end > length:
            raise InvalidInput(f"request body is longer than its Content-Length {length}")
        view[filled:end] = chunk
        filled = end
    if filled != length:
        raise InvalidInput(f"request body has {filled} of its Content-Length {length} bytes")
    return body


def _connected() -> bool:
    """A request answered on the loop in one step cannot lose its client meanwhile."""
    return True


def _reply(chunks: Sequence[Buffer], json_length: int | None) -> Reply:
    if json_length is None:
        return Reply(200, b"application/json", chunks)
    extra = ((b"Inference-Header-Content-Length", b"%d" % json_length),)
    return Reply(200, b"application/octet-stream", chunks, extra)


def _wants_compression(request: web.Request, size: int) -> bool:
    if size < MIN_COMPRESSED_BYTES:
        return False
    encoding = request.headers.get("Accept-Encoding", "")
    return "gzip" in encoding or "deflate" in encoding


class HttpFrontend:
    """Builds the aiohttp Application.

    `shared_memory` is the registry requests name their tensors' regions in (the one the
    control service registers them in); `limits` are checked on declared shapes while decoding;
    `header_forward`: the headers infer requests give the model as parameters (None: none).
    """

    def __init__(
        self,
        inference: InferenceService,
        control: ControlService,
        max_body_bytes: int,
        restrictions: Restrictions | None = None,
        *,
        shared_memory: SharedMemoryRegistry,
        limits: RequestLimits,
        status: StatusService | None = None,
        header_forward: HeaderForward | None = None,
        origins: RequestOrigins | None = None,
    ) -> None:
        self.inference = inference
        # Host / Origin / Content-Type checks against web pages (None: none, as in unit tests).
        self.origins = origins
        self.control = control
        self.max_body_bytes = max_body_bytes
        self.restrictions = restrictions
        self.shared_memory = shared_memory
        self.limits = limits
        self.header_plans = HeaderPlans()  # binary requests' headers decoded before
        self.refused = RefusedBodies()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.status_page = StatusPage(status) if status is not None else None
        if self.status_page is not None and restrictions:
            hidden = [a for a in DATA_APIS[1:] if restrictions.restricts(a)]
            if hidden:
                log.info(
                    "the status page's data (/status.json) shows what the restricted %s API "
                    "shows: it needs their headers too",
                    ", ".join(hidden),
                )
        # --http-header-forward-pattern: None without it (the infer path never looks further).
        self.header_forward = header_forward
        self.route_groups: dict[tuple[str, str], tuple[str, ...]] = {}  # filled by build()
        self._known_paths: list[re.Pattern[str]] = []  # filled by build(): 405 or 404

    def build(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        routes: list[tuple[str, str, Handler, str | tuple[str, ...]]] = [
            ("GET", "/v2/health/live", self.live, "health"),
            ("GET", "/v2/health/ready", self.ready, "health"),
            ("GET", "/v2", self.server_metadata, "metadata"),
            ("GET", "/v2/models/stats", self.stats, "statistics"),
            ("POST", "/v2/repository/index", self.repository_index, "model-repository"),
            ("GET", "/v2/trace/setting", self.trace_setting, "trace"),
            ("POST", "/v2/trace/setting", self.trace_setting, "trace"),
            ("GET", "/v2/logging", self.logging_settings, "logging"),
            ("POST", "/v2/logging", self.logging_settings, "logging"),
            ("GET", "/v2/models/{model}/trace/setting", self.trace_setting, "trace"),
            ("POST", "/v2/models/{model}/trace/setting", self.trace_setting, "trace"),
            ("POST", "/v2/repository/models/{model}/load", self.load, "model-repository"),
            ("POST", "/v2/repository/models/{model}/unload", self.unload, "model-repository"),
        ]
        shm = "/v2/systemsharedmemory"
        routes += [
            ("GET", f"{shm}/status", self.shm_status, "shared-memory"),
            ("GET", f"{shm}/region/{{region}}/status", self.shm_status, "shared-memory"),
            ("POST", f"{shm}/region/{{region}}/register", self.shm_register, "shared-memory"),
            ("POST", f"{shm}/region/{{region}}/unregister", self.shm_unregister, "shared-memory"),
            ("POST", f"{shm}/unregister", self.shm_unregister, "shared-memory"),
        ]
        cuda = "/v2/cudasharedmemory"
        routes += [
            ("GET", f"{cuda}/status", self.cuda_status, "shared-memory"),
            ("GET", f"{cuda}/region/{{region}}/status", self.cuda_status, "shared-memory"),
            ("POST", f"{cuda}/region/{{region}}/register", self.cuda_register, "shared-memory"),
            ("POST", f"{cuda}/region/{{region}}/unregister", self.cuda_unregister, "shared-memory"),
            ("POST", f"{cuda}/unregister", self.cuda_unregister, "shared-memory"),
        ]
        # A version is ASCII digits, as tritonserver's routes take it: any other word (or another
        # script's digits) is an unknown route.
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version:[0-9]+}"):
            routes += [
                ("GET", prefix, self.model_metadata, "metadata"),
                ("GET", prefix + "/ready", self.model_ready, "health"),
                ("GET", prefix + "/config", self.model_config, "model-config"),
                ("GET", prefix + "/stats", self.stats, "statistics"),
                ("POST", prefix + "/infer", self.infer, "inference"),
                ("POST", prefix + "/generate", self.generate, "inference"),
                ("POST", prefix + "/generate_stream", self.generate_stream, "inference"),
            ]
        if self.status_page is not None:  # GET /, /status, /status.json, /openapi.json
            routes += self.status_page.routes()
        # (method, path) -> its restricted-API groups, for tests/security/test_route_groups.py,
        # which fails on any route of the app that is not here with a group.
        self.route_groups = {}
        for method, path, handler, api in routes:
            guarded = _guard(handler, api, self.restrictions, self.origins, self.max_body_bytes)
            app.router.add_route(method, path, guarded)
            canonical = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", path)  # as aiohttp names it
            self.route_groups[(method, canonical)] = (api,) if isinstance(api, str) else api
        # 404s and 405s, in no group
        self._known_paths = [_path_pattern(path) for _, path, _, _ in routes]
        app.router.add_route("*", "/{tail:.*}", _guard(self.not_found, origins=self.origins))
        return app

    @staticmethod
    def _model(request: web.Request) -> tuple[str, str]:
        info = request.match_info
        return info["model"], info.get("version", "")

    # ---- handlers ----------------------------------------------------------------------------

    async def infer(self, request: web.Request) -> web.StreamResponse:
        model, version = self._model(request)
        # Admission before a byte of the body is read: an overloaded model's refusal costs
        # no body copy, decode or validation (frontends/http/refusals.py discards the body).
        try:
            admission = self.inference.admit(model, version)
        except ApplianceError as exc:
            refusal = error_response(HTTP_STATUS[exc.code], _refusal_text(exc))
            return await self.refused.refuse(request, refusal)
        with admission:  # released at once if the body cannot be read
            body = await read_body(request, self.max_body_bytes)
        answer = self.infer_reply(
            model, version, admission, body, request.headers, self._raw_headers(request)
        )
        reply = answer if isinstance(answer, Reply) else await answer
        if reply.status != 200:
            return web.Response(
                status=reply.status, body=b"".join(reply.chunks), content_type=_JSON
            )
        headers = {k.decode(): v.decode() for k, v in reply.headers}
        content_type = reply.content_type.decode()
        total = sum(len(chunk) for chunk in reply.chunks)
        if total >= STREAMED_BYTES and not _wants_compression(request, total):
            # Tensor bytes go to the socket from the model's output arrays: no join copy.
            stream = web.StreamResponse(headers=headers)
            stream.content_type = content_type
            stream.content_length = total
            await stream.prepare(request)
            for chunk in reply.chunks:
                await stream.write(chunk)
            await stream.write_eof()
            return stream
        resp = web.Response(body=b"".join(reply.chunks), headers=headers)
        resp.content_type = content_type
        if _wants_compression(request, total):
            resp.enable_compression()
        return resp

    def _raw_headers(self, request: web.Request) -> Sequence[tuple[bytes, bytes]]:
        """The headers as sent, for header forwarding (none without it): a request relayed
        from fastpath.py carries them as httptools gave them."""
        if self.header_forward is None:
            return ()
        protocol = request.protocol
        if isinstance(protocol, RelayHandler) and protocol.raw_headers:
            return protocol.raw_headers
        return request.raw_headers

    # ---- the infer route without aiohttp (frontends/http/fastpath.py) -------------------------

    def admit(self, model: str, version: str, headers: Mapping[str, str]) -> Admission | Reply:
        """What the aiohttp route's guard and `infer` check before the body is read (a body
        with a Content-Encoding never comes here: fastpath.py relays it to aiohttp's route)."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("HTTP request: POST %s/%s infer", model, version)
        origins = self.origins
        if origins is not None:
            refused = origins.problem(
                "POST", headers.get("host"), headers.get("origin"), False, None
            )
            if refused is not None:
                return self.error(*refused)
        try:
            if self.restrictions:
                self.restrictions.check("inference", headers)
            return self.inference.admit(model, version)
        except ApplianceError as exc:
            return self.error(HTTP_STATUS[exc.code], _refusal_text(exc))

    def infer_reply(
        self,
        model: str,
        version: str,
        admission: Admission,
        body: Body,
        headers: Mapping[str, str],
        raw_headers: Sequence[tuple[bytes, bytes]],
    ) -> Reply | Coroutine[Any, Any, Reply]:
        """The answer to an infer request whose body is in (fastpath.py's, or aiohttp's route
        above), errors included. A model cheap enough to run inline runs now, on the loop
        (`InferenceService.infer_here` with `inline`): the Reply. Otherwise the coroutine that
        queues it and answers. `headers`: case-insensitive, or with lower-case names;
        `raw_headers`: as they came, read only with --http-header-forward-pattern."""
        shm = self.shared_memory
        # The regions the request names are held until it is answered (as `request_scope`).
        holds: RequestHolds | None = None
        try:
            with shm.request_holds() as holds, admission:
                wire = decode_request(
                    body,
                    headers.get("inference-header-content-length"),  # fastpath: lower case
                    model,
                    version,
                    shm,
                    self.limits,
                    lambda: self.control.model_config(model, version),
                    self.header_plans,
                )
                if self.header_forward is not None:  # after decoding, as tritonserver
                    wire.request.parameters.update(self.header_forward.parameters(raw_headers))
                loop = self._loop or self._set_loop()
                outcome = self.inference.infer_here(
                    wire.request, admission, loop, _connected, inline=True
                )
            if isinstance(outcome, Prepared):
                later, holds = self._fast_later(holds, wire, outcome), None
                return later
            return _reply(*encode_response(outcome, wire, shm))
        except Exception as exc:
            return self._fast_error(model, exc)
        finally:
            if holds is not None:
                holds.release()

    async def _fast_later(
        self, holds: RequestHolds, wire: HttpInferRequest, prepared: Prepared
    ) -> Reply:
        try:
            response = await self.inference.infer_prepared(prepared)
            return _reply(*encode_response(response, wire, self.shared_memory))
        except Exception as exc:
            return self._fast_error(wire.request.model_name, exc)
        finally:
            holds.release()

    def _fast_error(self, model: str, exc: Exception) -> Reply:
        if isinstance(exc, ApplianceError):
            return self.error(HTTP_STATUS[exc.code], _refusal_text(exc))
        log.error(
            "unexpected error handling POST %s infer", model, exc_info=exc, extra=RATE_LIMITED
        )
        return self.error(500, "internal error; see the server log")

    def _set_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()  # the one the listeners run on
        return self._loop

    @staticmethod
    def error(status: int, message: str) -> Reply:
        return Reply(status, b"application/json", [orjson.dumps({"error": message})])

    async def _generate_request(self, request: web.Request) -> InferRequest:
        model, version = self._model(request)
        metadata = convert.model_metadata(self.control.model_metadata(model, version))
        return decode_generate(await self._json_body(request), model, version, metadata)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """One response; a decoupled model's responses must come one by one (generate_stream)."""
        infer = await self._generate_request(request)
        model = infer.model_name
        first: InferResponse | None = None
        # infer_stream is an async generator: closed here, it cancels the request.
        stream = cast(AsyncGenerator[InferResponse, None], self.inference.infer_stream(infer))
        try:
            async for response in stream:
                if first is not None:
                    # Refused at the second: a decoupled model may send responses without
                    # end, and none may pile up here (the request is cancelled on close).
                    raise InvalidInput(
                        f"expected a single response, got more: model '{model}' is decoupled "
                        "and sent a second one; the request is cancelled (use generate_stream)"
                    )
                first = response
        finally:
            await stream.aclose()
        if first is None:
            raise InvalidInput(f"expected a single response, got 0 from model '{model}'")
        return json_response(encode_generate(first))

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: one `data:` line per response; errors as an `error` event."""
        infer = await self._generate_request(request)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        try:
            async for response in self.inference.infer_stream(infer):
                data = orjson.dumps(encode_generate(response))
                await stream.write(b"data: " + data + b"\n\n")
        except ApplianceError as exc:
            await stream.write(b"data: " + orjson.dumps({"error": exc.message}) + b"\n\n")
        await stream.write_eof()
        return stream

    async def live(self, request: web.Request) -> web.StreamResponse:
        return _empty(200 if self.control.server_live() else 400)

    async def ready(self, request: web.Request) -> web.StreamResponse:
        readiness = await self.control.asked_readiness()
        status = 200 if readiness.ready else 400
        if request.query.get("verbose", "").lower() in ("1", "true"):
            return json_response(convert.readiness(readiness), status)  # says why
        # An empty body, as tritonserver's: Triton's scripts compare `curl -s -w %{http_code}`
        # to exactly "200".
        return _empty(status)

    async def server_metadata(self, request: web.Request) -> web.StreamResponse:
        return json_response(convert.server_metadata(self.control.server_metadata()))

    async def model_metadata(self, request: web.Request) -> web.StreamResponse:
        result = self.control.model_metadata(*self._model(request))
        return json_response(convert.model_metadata(result))

    async def model_ready(self, request: web.Request) -> web.StreamResponse:
        if await self.control.model_ready_async(*self._model(request)):
            return _empty(200)
        return error_response(400, "Model version not ready")  # tritonserver's body

    async def model_config(self, request: web.Request) -> web.StreamResponse:
        config = self.control.model_config(*self._model(request))
        return json_response(convert.model_config(config))

    async def stats(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        rows = self.control.statistics(info.get("model", ""), info.get("version", ""))
        return json_response(convert.statistics(rows))

    async def trace_setting(self, request: web.Request) -> web.StreamResponse:
        changes = await self._json_body(request) if request.method == "POST" else None
        model = request.match_info.get("model", "")
        return json_response(convert.trace_settings(self.control.trace_settings(model, changes)))

    async def logging_settings(self, request: web.Request) -> web.StreamResponse:
        changes = await self._json_body(request) if request.method == "POST" else None
        return json_response(convert.log_settings(self.control.log_settings(changes)))

    async def repository_index(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._json_body(request)
        except InvalidInput:
            # Triton's current order of checks: a 'ready' that is an array or object is
            # refused for its type before its depth is looked at (L0_http's deeply nested case)
            if _READY_NOT_SCALAR.match(await request.read()):
                raise InvalidInput(_READY_NOT_BOOL) from None
            raise
        ready = body.get("ready", False)
        if type(ready) is not bool:  # Triton's current words (2.51: a 500, other words)
            raise InvalidInput(_READY_NOT_BOOL)
        rows = self.control.repository_index(ready)
        return json_response(convert.repository_index(rows))

    async def load(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput("'parameters' must be a JSON object")
        await self.control.load_model(request.match_info["model"], params)
        return _empty(200, _JSON)

    async def unload(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        params = body.get("parameters") or {}
        dependents = (
            bool(params.get("unload_dependents", False)) if isinstance(params, dict) else False
        )
        await self.control.unload_model(request.match_info["model"], dependents)
        return _empty(200, _JSON)

    # ---- system shared memory ----------------------------------------------------------------

    async def shm_status(self, request: web.Request) -> web.StreamResponse:
        regions = self.control.system_shared_memory_status(request.match_info.get("region", ""))
        return json_response(convert.system_shared_memory_status(regions))

    async def shm_register(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["region"]
        body = await self._json_body(request)
        key = body.get("key")
        if key is None:
            raise InvalidInput("Shared memory register request has no 'key' field")
        if type(key) is not str:
            raise InvalidInput(f"shared memory region '{name}': 'key' must be a string")
        # Offset and size are JSON values of any type here: the registry checks and names them.
        try:
            self.control.register_system_shared_memory(
                name, key, body.get("offset", 0), body.get("byte_size", 0)
            )
        except TooManyRegions as exc:
            return error_response(REGION_CAP_STATUS, exc.message)
        return _empty(200, _JSON)

    async def shm_unregister(self, request: web.Request) -> web.StreamResponse:
        self.control.unregister_system_shared_memory(request.match_info.get("region", ""))
        return _empty(200, _JSON)

    async def cuda_status(self, request: web.Request) -> web.StreamResponse:
        regions = self.control.cuda_shared_memory_status(request.match_info.get("region", ""))
        return json_response(convert.cuda_shared_memory_status(regions))

    async def cuda_register(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["region"]
        body = await self._json_body(request)
        handle = body.get("raw_handle")
        encoded = handle.get("b64") if isinstance(handle, dict) else None
        if type(encoded) is not str:
            raise InvalidInput(
                f"CUDA shared memory region '{name}': 'raw_handle' must be {{\"b64\": ...}}"
            )
        try:
            raw = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise InvalidInput(
                f"CUDA shared memory region '{name}': raw_handle.b64 is not base64"
            ) from None
        # Device id and size are JSON values of any type here: the registry checks them.
        try:
            await self.control.register_cuda_shared_memory(
                name, raw, body.get("device_id", 0), body.get("byte_size", 0)
            )
        except TooManyRegions as exc:
            return error_response(REGION_CAP_STATUS, exc.message)
        return _empty(200, _JSON)

    async def cuda_unregister(self, request: web.Request) -> web.StreamResponse:
        self.control.unregister_cuda_shared_memory(request.match_info.get("region", ""))
        return _empty(200, _JSON)

    async def not_found(self, request: web.Request) -> web.StreamResponse:
        """tritonserver's answers: a known path with another method is 405, any other 404."""
        if any(pattern.fullmatch(request.path) for pattern in self._known_paths):
            return error_response(405, "Method Not Allowed")
        return error_response(404, "Not Found")

    @staticmethod
    async def _json_body(request: web.Request) -> dict[str, Any]:
        body = await request.read()
        if not body:
            return {}
        doc = jsonconv.loads(body, "the request body")
        if not isinstance(doc, dict):
            raise InvalidInput("request body must be a JSON object")
        return doc
