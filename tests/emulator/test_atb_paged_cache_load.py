"""The torch_npu stand-in's `torch_npu.atb.npu_paged_cache_load` (ATB PagedCacheLoadOperation, ND
caches; vllm_npu_ext/emulator/operators/atb.py), against what the paged cache was given: keys and
values are written with the emulated `_npu_reshape_and_cache` at the slots of a shuffled block
table, then loaded back and compared exactly with the tokens written, request by request, as
ATB's golden reference (`test_paged_cache_load_operation_nd.py`) and op-plugin's
(`test_atb_paged_cache_load.py`) gather them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch
from support.scripts import load_script
from torch.utils._python_dispatch import TorchDispatchMode

from vllm_npu_ext import emulator
from vllm_npu_ext.emulator.operators import atb

BLOCK, BLOCKS, HEADS, K_DIM, V_DIM = 4, 16, 2, 16, 8
LENGTHS = (13, 5, 20)  # tokens each request holds in the cache: unequal, partial last blocks


def _paged(dtype=torch.bfloat16, lengths=LENGTHS, v_dim=V_DIM, seed=0):
    """Caches holding `lengths` tokens per request at the blocks of a shuffled block table
    (written by the emulated `_npu_reshape_and_cache`); the keys and values written."""
    generator = torch.Generator().manual_seed(seed)
    key_cache = torch.zeros(BLOCKS, BLOCK, HEADS, K_DIM, dtype=dtype)
    value_cache = torch.zeros(BLOCKS, BLOCK, HEADS, v_dim, dtype=dtype)
    width = max(-(-n // BLOCK) for n in lengths) + 1  # one column more than any request uses
    table = torch.full((len(lengths), width), -1, dtype=torch.int32)  # unused columns: -1
    free = torch.randperm(BLOCKS, generator=generator).tolist()
    keys, values = [], []
    for request, n in enumerate(lengths):
        blocks = [free.pop() for _ in range(-(-n // BLOCK))]
        table[request, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        slots = torch.tensor([blocks[j // BLOCK] * BLOCK + j % BLOCK for j in range(n)],
                             dtype=torch.int32)  # fmt: skip
        key = (torch.randn(n, HEADS, K_DIM, generator=generator) * 20).to(dtype)
        value = (torch.randn(n, HEADS, v_dim, generator=generator) * 20).to(dtype)
        atb._npu_reshape_and_cache(key=key, value=value, key_cache=key_cache,
                                   value_cache=value_cache, slot_indices=slots)  # fmt: skip
        keys.append(key)
        values.append(value)
    return key_cache, value_cache, table, keys, values


def _outputs(tokens, dtype=torch.bfloat16, v_dim=V_DIM):
    """Output buffers filled with a sentinel, so rows the operator must not write stay seen."""
    return (torch.full((tokens, HEADS, K_DIM), 99, dtype=dtype),
            torch.full((tokens, HEADS, v_dim), 99, dtype=dtype))  # fmt: skip


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


@pytest.mark.parametrize(("dtype", "v_dim"),
                         [(torch.bfloat16, V_DIM), (torch.float16, V_DIM), (torch.int8, 16)])
def test_loads_back_every_request_packed_in_order(dtype, v_dim):
    key_cache, value_cache, table, keys, values = _paged(dtype, v_dim=v_dim)
    key, value = _outputs(sum(LENGTHS), dtype, v_dim)
    before = atb.calls["npu_paged_cache_load"]
    result = atb.npu_paged_cache_load(key_cache, value_cache, table, _i32(LENGTHS),
                                      seq_starts=_i32([0, 0, 0]), key=key, value=value)  # fmt: skip
    assert result[0] is key and result[1] is value  # `.out`: the buffers given, written in place
    assert torch.equal(key, torch.cat(keys)) and torch.equal(value, torch.cat(values))
    assert atb.calls["npu_paged_cache_load"] == before + 1


def test_seq_starts_skip_the_first_tokens_of_each_request():
    """Chunked context: request b's chunk is tokens [seq_starts[b], seq_starts[b] + n_b) of its
    context (vllm-ascend's starts are multiples of block_size)."""
    key_cache, value_cache, table, keys, values = _paged()
    starts, lens = [4, 0, 8], [9, 3, 12]
    key, value = _outputs(sum(lens) + 2)  # two rows more than needed: left untouched
    atb.npu_paged_cache_load(key_cache, value_cache, table, _i32(lens),
                             seq_starts=_i32(starts), key=key, value=value)  # fmt: skip
    want_k = torch.cat([k[s : s + n] for k, s, n in zip(keys, starts, lens, strict=True)])
    want_v = torch.cat([v[s : s + n] for v, s, n in zip(values, starts, lens, strict=True)])
    assert torch.equal(key[: sum(lens)], want_k) and torch.equal(value[: sum(lens)], want_v)
    assert torch.all(key[sum(lens) :] == 99) and torch.all(value[sum(lens) :] == 99)


def test_seq_starts_offset_whole_blocks_as_the_kernel_does():
    """The ND kernel skips seq_starts // block_size blocks (ATB `PagedCacheLoadNd<T>::Process`, its
    `tableOffset`; op-plugin's reference: `offset = seq_starts[bid].item() // block_size`): a start
    inside a block reads from that block's first row."""
    key_cache, value_cache, table, keys, _ = _paged()
    key, value = _outputs(6)
    atb.npu_paged_cache_load(key_cache, value_cache, table[:1], _i32([6]),
                             seq_starts=_i32([BLOCK + 3]), key=key, value=value)  # fmt: skip
    assert torch.equal(key, keys[0][BLOCK : BLOCK + 6])


def test_cumulative_lengths_and_the_functional_overload():
    key_cache, value_cache, table, keys, values = _paged()
    cumulative = _i32([0, 13, 18, 38])  # cumsum=True: context_lens [batch + 1]
    key, value = _outputs(38)
    atb.npu_paged_cache_load(key_cache, value_cache, table, cumulative, cumsum=True,
                             key=key, value=value)  # fmt: skip
    assert torch.equal(key, torch.cat(keys)) and torch.equal(value, torch.cat(values))
    # The first output row is context_lens[0] (ATB `PagedCacheLoadNd<T>::Process`, `tokenStart`
    # under cuSeqLens): rows before it stay as they were.
    key, value = _outputs(40)
    atb.npu_paged_cache_load(key_cache, value_cache, table, cumulative + 2, cumsum=True,
                             key=key, value=value)  # fmt: skip
    assert torch.all(key[:2] == 99) and torch.equal(key[2:], torch.cat(keys))
    # Without key and value: op-plugin allocates sum(context_lens) tokens.
    loaded_k, loaded_v = atb.npu_paged_cache_load(key_cache, value_cache, table,
                                                  _i32(LENGTHS), seq_starts=_i32([0, 0, 0]))
    assert torch.equal(loaded_k, torch.cat(keys)) and torch.equal(loaded_v, torch.cat(values))


def test_one_operator_with_the_schema_op_plugin_registers():
    assert str(torch.ops.atb.npu_paged_cache_load.out._schema) == (
        "atb::npu_paged_cache_load.out(Tensor key_cache, Tensor value_cache, Tensor block_table, "
        "Tensor context_lens, *, Tensor? seq_starts=None, bool cumsum=False, Tensor(a!) key, "
        "Tensor(b!) value) -> (Tensor(a!), Tensor(b!))"
    )
    key_cache, value_cache, table, *_ = _paged()
    key, value = _outputs(sum(LENGTHS))
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    lens, starts = _i32(LENGTHS), _i32([0, 0, 0])
    with Record():
        atb.npu_paged_cache_load(key_cache, value_cache, table, lens, seq_starts=starts,
                                 key=key, value=value)  # fmt: skip
    assert seen == ["atb.npu_paged_cache_load.out"]


def _vllm_ascend_device_op() -> tuple[str, str]:
    """vllm-ascend 0.23.0.post1's `device/device_op.py` (name, text): the installed one where
    there is one, else from its sha256-pinned sdist (build/sdist, or downloaded as the CP
    patch tests do), so the test runs on both stacks."""
    spec = importlib.util.find_spec("vllm_ascend")
    root = (Path(spec.origin).parent if spec and spec.origin else
            Path(__file__).resolve().parents[2] / ".venv-ascend/vllm-ascend/vllm_ascend")
    path = root / "device" / "device_op.py"
    if path.is_file():
        return str(path), path.read_text()
    check_script = load_script("scripts/check_vllm_ascend_patch.py")
    sdist_dir = Path(__file__).resolve().parents[2] / "build" / "sdist"
    sdist = sdist_dir / check_script.SDIST_NAME
    if not sdist.exists():
        try:
            sdist = check_script.download_sdist(sdist_dir)
        except OSError as error:
            pytest.fail(f"vllm-ascend sdist unavailable ({error})")
    return str(sdist), check_script.read_sources(sdist)["vllm_ascend/device/device_op.py"]


def test_reachable_as_vllm_ascend_calls_it():
    """`torch_npu.atb.npu_paged_cache_load(...)` on the stand-in module; with vllm-ascend
    0.23.0.post1's sources at hand, its own `BaseDeviceAdaptor.reshape_and_cache` and
    `kv_cache_load` run against it, unchanged."""
    key_cache, value_cache, table, keys, values = _paged()
    key, value = _outputs(sum(LENGTHS))
    with emulator.emulated():
        import torch_npu

        assert torch_npu.atb.npu_paged_cache_load is torch.ops.atb.npu_paged_cache_load
        torch_npu.atb.npu_paged_cache_load(key_cache, value_cache, table, _i32(LENGTHS),
                                           seq_starts=_i32([0, 0, 0]), key=key, value=value)
        with pytest.raises(AttributeError, match=r"torch_npu\.atb\.npu_ring_mla is not impl"):
            torch_npu.atb.npu_ring_mla  # noqa: B018
    assert torch.equal(key, torch.cat(keys)) and torch.equal(value, torch.cat(values))

    path, text = _vllm_ascend_device_op()
    tree = ast.parse(text)
    adaptor = next(node for node in tree.body
                   if isinstance(node, ast.ClassDef) and node.name == "BaseDeviceAdaptor")
    functions = [node for node in adaptor.body if isinstance(node, ast.FunctionDef)
                 and node.name in ("reshape_and_cache", "kv_cache_load")]  # fmt: skip
    for function in functions:
        function.decorator_list = []  # plain functions: `cls` is unused by both
    namespace = {"torch_npu": emulator}
    exec(compile(ast.Module(functions, []), path, "exec"), namespace)
    # vllm-ascend writes a rank's keys with reshape_and_cache, then loads them back.
    key_cache = torch.zeros_like(key_cache)
    value_cache = torch.zeros_like(value_cache)
    for request, n in enumerate(LENGTHS):
        blocks = table[request].tolist()
        slots = _i32([blocks[j // BLOCK] * BLOCK + j % BLOCK for j in range(n)])
        namespace["reshape_and_cache"](None, keys[request], values[request], key_cache,
                                       value_cache, slots)  # fmt: skip
    key, value = _outputs(9 + 5 + 12)
    namespace["kv_cache_load"](key_cache, value_cache, table, _i32([9, 5, 12]),
                               _i32([4, 0, 8]), key=key, value=value)  # fmt: skip
    assert torch.equal(key, torch.cat([keys[0][4:], keys[1], keys[2][8:]]))
    assert torch.equal(value, torch.cat([values[0][4:], values[1], values[2][8:]]))


@pytest.mark.parametrize(
    ("change", "error", "kind"),
    [({"block_table": "int64"}, "block_table must be a 2-D int32", TypeError),
     ({"context_lens": torch.tensor(LENGTHS)}, "context_lens must be a 1-D int32", TypeError),
     ({"block_id": BLOCKS}, "block_table row 1 holds a block id outside", ValueError),
     ({"block_id": -1}, "block_table row 1 holds a block id outside", ValueError),
     ({"key": _outputs(sum(LENGTHS) - 1)[0], "value": _outputs(sum(LENGTHS) - 1)[1]},
      "'key' and 'value' hold 37 tokens; context_lens needs 38", ValueError),
     ({"key": torch.zeros(38, HEADS, 8, dtype=torch.bfloat16)},
      "'key' .* must be \\[tokens, 2, 16\\]", ValueError),
     ({"value": torch.zeros(38, HEADS, K_DIM, dtype=torch.bfloat16)},
      "'value' .* must be \\[tokens, 2, 8\\]", ValueError),
     ({"value": torch.zeros(37, HEADS, V_DIM, dtype=torch.bfloat16)}, "one token count",
      ValueError),
     ({"key": torch.zeros(38, HEADS, K_DIM)}, "'key' dtype torch.float32", TypeError),
     ({"value_cache": torch.zeros(BLOCKS, BLOCK, 1, 16, dtype=torch.bfloat16)},
      "share num_blocks, block_size and num_heads", ValueError),
     ({"value_cache": torch.zeros(BLOCKS, BLOCK, 1, V_DIM, dtype=torch.bfloat16),
       "value": torch.zeros(38, 1, V_DIM, dtype=torch.bfloat16)}, "value_cache's num_heads",
      ValueError),
     ({"context_lens": _i32([13, 5])}, "context_lens must have 3 entries", ValueError),
     ({"context_lens": _i32([13, -5, 20])}, "non-negative", ValueError),
     ({"seq_starts": _i32([0, 0])}, "seq_starts must have block_table's 3", ValueError),
     ({"seq_starts": _i32([0, 0, 2 * BLOCK])}, "reads block_table column 6", ValueError),
     ({"key": torch.zeros(38, HEADS * K_DIM, dtype=torch.bfloat16)}, "FRACTAL_NZ",
      NotImplementedError),
     ({"key": torch.zeros(0, HEADS, K_DIM, dtype=torch.bfloat16)}, "'key' must not be empty",
      ValueError)],
)  # fmt: skip
def test_refuses_what_its_contract_excludes(change, error, kind):
    key_cache, value_cache, table, *_ = _paged()
    key, value = _outputs(sum(LENGTHS))
    change = dict(change)
    if change.pop("block_table", None) == "int64":
        table = table.long()
    if "block_id" in change:
        table[1, 0] = change.pop("block_id")
    args = {"key_cache": key_cache, "value_cache": value_cache, "block_table": table,
            "context_lens": _i32(LENGTHS), "seq_starts": _i32([0, 0, 0]), "key": key,
            "value": value, **change}  # fmt: skip
    positional = [args.pop(name) for name in ("key_cache", "value_cache", "block_table",
                                              "context_lens")]  # fmt: skip
    with pytest.raises(kind, match=error):
        atb.npu_paged_cache_load(*positional, **args)
    assert torch.all(key == 99) and torch.all(value == 99)  # nothing written before the refusal
