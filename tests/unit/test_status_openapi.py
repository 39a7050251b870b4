"""The OpenAPI description (frontends/http/static/openapi.json) names exactly the routes the
HTTP front end serves, each tagged with its restricted-API group."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, cast

import pytest

from appliance.common.access import APIS
from appliance.common.limits import RequestLimits
from appliance.frontends.http.server import HttpFrontend
from appliance.frontends.http.status_page import read_asset
from appliance.ops.logs import Problem
from appliance.services import status_results
from appliance.services.shared_memory import SharedMemoryRegistry
from appliance.services.status import StatusService

CATCH_ALL = "/{tail}"


def _served() -> set[tuple[str, str]]:
    frontend = HttpFrontend(
        cast(Any, None),  # building the router calls neither service
        cast(Any, None),
        1024,
        shared_memory=SharedMemoryRegistry(),
        limits=cast(RequestLimits, None),
        status=cast(StatusService, object()),
    )
    app = frontend.build()
    return {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.resource.canonical != CATCH_ALL
    }


def test_openapi_paths_are_the_routers_routes() -> None:
    doc = json.loads(read_asset("openapi.json"))
    described = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    served = _served()
    assert described - served == set(), "described but not served"
    assert served - described == set(), "served but not described"


def test_every_operation_names_a_known_api_group() -> None:
    doc = json.loads(read_asset("openapi.json"))
    assert doc["openapi"].startswith("3.")
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["x-restricted-api"] in APIS, (method, path)
            assert op["tags"] == [op["x-restricted-api"]]
            assert op["summary"]
    status_ops = {
        p for p, ops in doc["paths"].items() if ops.get("get", {}).get("tags") == ["status"]
    }
    assert status_ops == {"/", "/status", "/status.json", "/status/{asset}", "/openapi.json"}


def test_openapi_is_a_valid_description() -> None:
    validator = pytest.importorskip("openapi_spec_validator", reason="openapi-spec-validator")
    validator.validate(json.loads(read_asset("openapi.json")))


def test_the_status_schemas_name_the_reports_fields() -> None:
    """The documented /status.json schemas have exactly the fields of the typed results."""
    schemas = json.loads(read_asset("openapi.json"))["components"]["schemas"]
    classes = {
        name: cls
        for name, cls in [*vars(status_results).items(), ("Problem", Problem)]
        if dataclasses.is_dataclass(cls)
    }
    assert set(classes) <= set(schemas), "typed results with no schema"
    for name, cls in classes.items():
        fields = [f.name for f in dataclasses.fields(cls)]
        assert list(schemas[name]["properties"]) == fields, name
        assert schemas[name]["required"] == fields, name
        assert schemas[name]["additionalProperties"] is False, name
