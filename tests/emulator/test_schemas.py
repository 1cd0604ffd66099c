"""The emulator's schemas: the extraction script, and the committed JSON against a fresh
extraction from the pinned torch-npu wheel (downloaded here; a failed download fails)."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
from support.scripts import load_script

from vllm_npu_ext import emulator
from vllm_npu_ext.emulator.runtime import schema as _schema

extractor = load_script("scripts/extract_torch_npu_schemas.py")


# What a library's string table holds around its schema strings: other constants, C++
# signatures of the same operators (no `->`), and each schema once.
LIBRARY = b"\x00".join([
    b"\x7fELF\x02\x01", b"npu_swiglu(Tensor input, int dim=-1) -> Tensor",
    b"npu_swiglu(Tensor input, int64_t dim=-1)", b"activate_dim should be in range",
    b"npu_other(Tensor input, Reduction r=Mean) -> Tensor",
    b"npu_gmm(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, int? split_item=0) -> Tensor[]",
    b"npu_gmm.out(Tensor[] x, *, Tensor? workspace=None, Tensor[] out) -> (Tensor, Tensor)",
    b"npu_swiglu(Tensor input, int dim=-1) -> Tensor",
])


def test_extractor_reads_the_registered_schema_strings_of_a_library():
    found = extractor.collect_schemas(LIBRARY, operators=("npu_swiglu", "npu_gmm"))
    assert [s["schema"] for s in found["npu_swiglu"]] == [
        "npu_swiglu(Tensor input, int dim=-1) -> Tensor"]
    swiglu_dim = found["npu_swiglu"][0]["arguments"][1]
    assert swiglu_dim == {"name": "dim", "type": "int", "optional": False, "has_default": True,
                          "default": -1, "keyword_only": False}
    base, out = found["npu_gmm"]
    assert (base["overload"], out["overload"]) == ("", "out")
    assert [a["keyword_only"] for a in base["arguments"]] == [False, False, True, True]
    assert base["arguments"][2]["optional"] and base["arguments"][2]["default"] is None
    assert out["arguments"][-1]["type"] == "Tensor[]" and base["returns"] == "Tensor[]"
    with pytest.raises(ValueError, match="missing"):
        extractor.collect_schemas(LIBRARY, operators=("npu_absent",))
    conflicting = LIBRARY + b"\x00npu_swiglu(Tensor self, int dim=-1) -> Tensor"
    with pytest.raises(ValueError, match="two schemas for npu_swiglu"):
        extractor.collect_schemas(conflicting, operators=("npu_swiglu",))


def test_extractor_writes_json_from_a_wheel(tmp_path):
    wheel = tmp_path / "torch_npu-9.9.9-cp311-cp311-linux_x86_64.whl"
    library = b"\x00".join(f"{name}(Tensor input, float eps=1e-06) -> Tensor".encode()
                           for name in extractor.OPERATORS)
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(extractor.LIBRARY_PATH, library)
        archive.writestr("torch_npu-9.9.9.dist-info/METADATA", "Name: torch-npu\nVersion: 9.9.9\n")
    output = tmp_path / "schemas.json"
    assert extractor.main([str(wheel), "--output", str(output)]) == 0
    document = json.loads(output.read_text())
    assert document["torch_npu_version"] == "9.9.9" and document["source_wheel"] == wheel.name
    assert document["library_path"] == "torch_npu/lib/libtorch_npu.so"
    assert document["operators"]["npu_linear"][0]["arguments"][1]["default"] == 1e-06


@pytest.fixture(scope="module")
def pinned_wheel(request, tmp_path_factory) -> Path:
    """The pinned torch-npu wheel: TORCH_NPU_WHEEL if set, else pip-downloaded into pytest's
    cache (about 40 MB, once; a temporary directory when the cache plugin is off). A failed
    download fails the test with pip's message."""
    local = os.environ.get("TORCH_NPU_WHEEL")
    if local:
        if not Path(local).is_file():
            pytest.fail(f"TORCH_NPU_WHEEL={local} is not a file")
        return Path(local)
    pytest_cache = getattr(request.config, "cache", None)
    cache = (
        pytest_cache.mkdir("torch_npu_wheel")
        if pytest_cache is not None
        else tmp_path_factory.mktemp("torch_npu_wheel")
    )
    try:
        return extractor.download(extractor.PINNED_VERSION, cache)
    except RuntimeError as error:
        pytest.fail(f"cannot check the committed schemas against the pinned wheel: {error}")


def test_committed_schemas_equal_a_fresh_extraction_from_the_pinned_wheel(pinned_wheel):
    document = _schema.schema_document()
    assert extractor.PINNED_VERSION == "2.10.0.post4"  # vllm-ascend 0.23.0.post1's pin
    assert document["torch_npu_version"] == extractor.PINNED_VERSION
    assert document["source_wheel"] == extractor.wheel_name(extractor.PINNED_VERSION)
    assert set(document["operators"]) == set(extractor.OPERATORS) == set(emulator.OPERATORS)
    assert extractor.extract(pinned_wheel) == document
    for schemas in document["operators"].values():
        for schema in schemas:
            reparsed = extractor.parse_schema(schema["schema"])
            assert reparsed["arguments"] == schema["arguments"]
    fia_args = {a["name"]: a for a in document["operators"]["npu_fused_infer_attention_score"][0][
        "arguments"]}
    assert fia_args["actual_seq_lengths"]["type"] == "SymInt[]?"
    assert fia_args["scale"]["default"] == 1.0 and fia_args["scale"]["keyword_only"]
    # The registered `.out` takes a tensor list, as vllm-ascend passes it (`out=[...]`); the
    # wheel's codegen YAML says `attention_out, softmax_lse`.
    fia_out = document["operators"]["npu_fused_infer_attention_score"][1]
    assert fia_out["overload"] == "out" and fia_out["arguments"][-1]["type"] == "Tensor[]"
    rms_norm = document["operators"]["npu_rms_norm"][0]
    assert rms_norm["arguments"][0]["name"] == "input"  # the YAML: `self`


def test_a_failed_wheel_download_raises_with_pips_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "no-index").as_uri())
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"pip download of torch-npu==0\.0\.1 .*failed"):
        extractor.download("0.0.1", tmp_path / "dest")
