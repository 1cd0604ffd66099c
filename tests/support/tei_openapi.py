"""TEI's published OpenAPI document (v1.9.3, the response schemas vendored in
tests/entrypoints/tei_openapi_v1.9.3.json with their source), as JSON Schema validators.

OpenAPI 3.0 marks a nullable field `nullable: true`, which JSON Schema does not know: such a
field's type becomes `[type, "null"]`; `$ref`s resolve within the document.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

DOCUMENT = Path(__file__).resolve().parents[1] / "entrypoints" / "tei_openapi_v1.9.3.json"


@functools.cache
def document() -> dict:
    return json.loads(DOCUMENT.read_text(encoding="utf-8"))


def _json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _json_schema(value) for key, value in node.items() if key != "example"}
    if node.pop("nullable", False) and "type" in node:
        node["type"] = [node["type"], "null"]
    return node


def validate(path: str, status: int, body: Any, method: str = "post") -> None:
    """Raise jsonschema's ValidationError unless `body` is what TEI's document says `path`
    answers with `status`."""
    import jsonschema

    responses = document()["paths"][path][method]
    schema = {**_json_schema(responses[str(status)]),
              "components": _json_schema(document()["components"])}  # fmt: skip
    jsonschema.validate(body, schema)


def schema_of(name: str) -> dict:
    """A component schema, as JSON Schema with the document's components to resolve refs."""
    return {**_json_schema(document()["components"]["schemas"][name]),
            "components": _json_schema(document()["components"])}  # fmt: skip
