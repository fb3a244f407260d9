"""Requests built from the API's own OpenAPI document, so that tests generated from
``app.openapi()`` can call routes they were not written for.

:func:`operations` lists what the app declares; :func:`call` sends one operation with its path
parameters and the smallest valid request body, built from its JSON schema. The builder covers
what the API's pydantic models produce: ``$ref``, ``anyOf``/``oneOf`` (the first non-null
choice), ``const``/``enum``, objects (required properties only), arrays, and bounded numbers
and strings. A string with a ``pattern`` takes the first of a few candidates that matches, and
anything it cannot satisfy raises, so a test fails rather than sends a guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

STRING_CANDIDATES = ("x", "a1", "example", "1", "x" * 8)


METHODS = ("get", "post", "put", "patch", "delete")


class NoExample(ValueError):
    """The schema asks for something this builder cannot produce."""


@dataclass(frozen=True)
class Operation:
    method: str
    template: str
    spec: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.method.upper()} {self.template}"

    def path_parameters(self) -> list[dict[str, Any]]:
        return [p for p in self.spec.get("parameters", []) if p.get("in") == "path"]


def operations(app: FastAPI) -> Iterator[Operation]:
    for template, item in app.openapi()["paths"].items():
        for method in METHODS:
            if method in item:
                yield Operation(method, template, item[method])


def call(
    client: TestClient,
    app: FastAPI,
    operation: Operation,
    values: dict[str, Any],
    headers: dict[str, str],
) -> Any:
    """Send ``operation`` with path parameters from ``values`` (else their smallest valid
    value, inserted verbatim: a value may carry %-escapes) and its smallest valid body. A query
    parameter or a property of an object body that ``values`` names is sent with that value
    (an agent's ``node``, say), optional or not. An event stream (a ``follow`` parameter) is
    asked not to follow, so that it ends."""
    openapi = app.openapi()
    path = operation.template
    for parameter in operation.path_parameters():
        name = parameter["name"]
        value = values.get(name, example(openapi, parameter.get("schema", {})))
        path = path.replace(f"{{{name}}}", str(value))
    query = {
        p["name"]: values[p["name"]]
        for p in operation.spec.get("parameters", [])
        if p.get("in") == "query" and p["name"] in values
    }
    if any(p.get("name") == "follow" for p in operation.spec.get("parameters", [])):
        query["follow"] = "false"  # an event stream that follows never ends
    body = request_body(openapi, operation.spec)
    if isinstance(body, dict):
        body.update({k: values[k] for k in body_properties(openapi, operation.spec) if k in values})
    return client.request(operation.method, path, params=query, json=body, headers=headers)


def body_properties(openapi: dict[str, Any], operation: dict[str, Any]) -> set[str]:
    """The property names of ``operation``'s JSON object body (the choice :func:`example`
    makes of a union); empty when it takes none."""
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema", {})
    while True:
        if "$ref" in schema:
            schema = _resolve(openapi, schema["$ref"])
            continue
        choices = [
            c for c in schema.get("oneOf", schema.get("anyOf", [])) if c.get("type") != "null"
        ]
        if choices:
            schema = choices[0]
            continue
        return set(schema.get("properties", {}))


def request_body(openapi: dict[str, Any], operation: dict[str, Any]) -> Any | None:
    """An instance of ``operation``'s JSON request body, or None when it takes no body."""
    content = operation.get("requestBody", {}).get("content", {})
    if "application/json" not in content:
        return None
    return example(openapi, content["application/json"].get("schema", {}))


def example(openapi: dict[str, Any], schema: dict[str, Any]) -> Any:
    """The smallest instance of ``schema`` (components resolved against ``openapi``)."""
    if "$ref" in schema:
        return example(openapi, _resolve(openapi, schema["$ref"]))
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            choices = [c for c in schema[key] if c.get("type") != "null"]
            return example(openapi, choices[0] if choices else {"type": "null"})
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(example(openapi, part))
        return merged
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        return {
            name: example(openapi, properties.get(name, {})) for name in schema.get("required", [])
        }
    if kind == "array":
        return [example(openapi, schema.get("items", {})) for _ in range(schema.get("minItems", 0))]
    if kind in ("integer", "number"):
        return _number(schema, integer=kind == "integer")
    if kind == "string":
        return _string(schema)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    raise NoExample(f"no example for schema {schema}")


def _resolve(openapi: dict[str, Any], ref: str) -> dict[str, Any]:
    node: Any = openapi
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    resolved: dict[str, Any] = node
    return resolved


def _number(schema: dict[str, Any], *, integer: bool) -> int | float:
    low = max(1, schema.get("minimum", 1))
    if "exclusiveMinimum" in schema:
        low = max(low, schema["exclusiveMinimum"] + 1)
    high = schema.get("maximum", schema.get("exclusiveMaximum", low + 1))
    if low > high:
        raise NoExample(f"no number in {schema}")
    return int(low) if integer else float(low)


def _string(schema: dict[str, Any]) -> str:
    length = max(1, schema.get("minLength", 1))
    candidates = ("x" * length, *STRING_CANDIDATES)
    pattern = schema.get("pattern")
    for candidate in candidates:
        fits = len(candidate) >= schema.get("minLength", 0) and len(candidate) <= schema.get(
            "maxLength", len(candidate)
        )
        if fits and (pattern is None or re.search(pattern, candidate)):
            return candidate
    raise NoExample(f"no string for {schema}")
