"""Bad `/v1/embeddings` requests: each one must get HTTP 400 with a message, on every server.

Shared by the idle-server tests (tests/test_server.py), the emulated server's
(tests/test_emulated_server.py), the faults under load (tests/test_faults.py) and the mixed
load (tests/test_load.py).
"""

from __future__ import annotations

from support.loadgen import Request

# name -> request body without "model"
BAD_INPUTS: dict[str, dict] = {
    "empty string": {"input": ""},
    "empty string in list": {"input": ["fine", ""]},
    "empty list": {"input": []},
    "token id outside the vocabulary": {"input": [[1, 2, 10**9]]},
    "negative token id": {"input": [[3, -1]]},
    "longer than max-model-len": {"input": "word " * 400},
    "input of wrong type": {"input": 42},
    "input object": {"input": {"text": "x"}},
    "mixed list": {"input": ["a", 1]},
    "list of lists of strings": {"input": [["a"]]},
    "dimensions too large": {"input": "x", "dimensions": 100000},
    "dimensions zero": {"input": "x", "dimensions": 0},
    "dimensions not a number": {"input": "x", "dimensions": "eight"},
    "encoding_format unknown": {"input": "x", "encoding_format": "hex"},
    "too many inputs": {"input": ["x"] * 2049},
}
MALFORMED_JSON = b'{"input": ["x"'


def bad_requests(model: str) -> dict[str, Request]:
    """Every `BAD_INPUTS` case for `model`, plus malformed JSON."""
    requests = {name: Request({"model": model, **body}) for name, body in BAD_INPUTS.items()}
    requests["malformed JSON"] = Request(MALFORMED_JSON)
    return requests
