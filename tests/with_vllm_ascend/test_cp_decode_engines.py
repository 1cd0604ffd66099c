"""Long-context CP decode, end to end: vLLM 0.23 engines and servers on vllm-ascend 0.23's
NPUPlatform under the torch_npu stand-in, generating through our merge.

One tiny bf16 Qwen3 (`make_tiny_model(preset="cp")`: head_dim 128, one KV head, so that
DCP 2 fits TP 2), three prompts of 3100, 2400 and 2000 tokens, the second starting with the
first's 2048 (`support/cp_decode.py`), 12 greedy tokens with logprobs. Started together, at
most two at a time (a TP 2 server is four processes):

- servers at vLLM's defaults: `vllm-npu-ext serve CKPT -tp 2 -dcp 2` and `... -pcp 2` (which
  generate, with CP) and a TP 2 server without CP (`--runner generate`), each with only what
  the tests need besides (`SERVER_TEST_FLAGS`: our worker extension,
  `support/cp_worker_extension.py`, whose probes vLLM's dev-mode `/collective_rpc` reads; a
  chat template; 1 GiB of stand-in device memory per rank);
- engines (`support/cp_generation_worker.py`): DCP 2 (TP 2) and PCP 2 (TP 1) at vLLM's
  defaults (graph mode FULL_AND_PIECEWISE: decode in vllm-ascend's full decode graphs, async
  scheduling, prefix caching and chunked prefill with a 512-token budget, below every
  prompt), each generating the prompts twice (the second time from the prefix cache), with
  our merge and, in an engine of its own, vllm-ascend's (a full graph keeps the merge it
  captured); DCP 2 and PCP 2 eager; TP 1 with our plugin and TP 1 stock (our plugin left out
  of VLLM_PLUGINS), the latter two in-process;
- a DCP 2 engine in FULL_DECODE_ONLY (npugraph_ex off), against the TP 2 server;
- a DCP 2 engine at the defaults with cp_kv_cache_interleave_size 16 and prompts that leave
  rank 1 without keys (`SHORT`), in a context chunk and in decode steps, against the TP 2
  server's answers to the same prompts.

The eager CP runs (whole prompts in one step, no prefix caching) generate with our merge,
then in the same engine with vllm-ascend's own pair (the patch undone in every worker). CP
runs are compared with their non-CP baseline (TP 1 eager with whole prompts, or the TP 2
server) within the bf16 bound
derived in `support/cp_decode.py`. `enable_cp()` is cached per process
(vllm-ascend 0.23.0.post1 `vllm_ascend.attention.utils.enable_cp`): every configuration is a
process of its own.

Run settings and why: `cp_kv_cache_interleave_size` 1 (vLLM's default) and prompts longer
than pcp x dcp tokens, except in the `SHORT` engine. PCP runs at vLLM's default async
scheduling: vllm-ascend's DualChunkSwap padding reads a reused input-batch row's stale -1
placeholders as token ids (vllm-ascend 0.23.0.post1 `NPUModelRunner._bookkeeping_sync`), which our
`vllm_ascend_pcp_input_ids` patch sets to 0 (without it: IndexError on the host at TP 1).
Our CANN operator is the stand-in's build of it (VLLM_NPU_EXT_EMULATE_OPS=1, the default
under VLLM_NPU_EXT_EMULATE=1).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.cp_decode import (
    CHAT_TEMPLATE,
    CHUNK_BUDGET,
    MAX_MODEL_LEN,
    MAX_TOKENS,
    PROMPT_TOKENS,
    SERVER_DEVICE_MIB,
    SERVER_TEST_FLAGS,
    SHARED_PREFIX,
    compare,
    forced_token,
    from_chat,
    from_completion,
    largest_logit,
    prompt_text,
    prompts,
    start_engine,
)
from support.server import Server
from support.vllm_ascend_env import server_env, vllm_port

MERGES = ("ours", "vllm-ascend")
# Requests that leave a rank without keys, at cp_kv_cache_interleave_size 16: DCP rank 1 holds
# no key of a sequence of at most 16 tokens (`pcp_utils._get_cp_local_seq_lens`). Prompts of
# (long prompt, first tokens): with a 128-token budget the 40-token one is prefilled 10 + 30
# and its second chunk's context (10 tokens, none on rank 1) shares a step with the 300-token
# one's (some on rank 1): rank 1's context FIA runs with 0 keys for it. The 2, 11 and 30-token
# ones decode with no key on rank 1 for the first in every step, the second in its first 5, the
# third never: empty shards in full decode graphs, mixed in a batch.
SHORT = ((0, 758), (2, 40), (1, 300), (0, 2), (1, 11), (2, 30))
INTERLEAVE, SHORT_BUDGET = 16, 128
# vLLM's defaults for generation over the common settings: its graph mode (FULL_AND_PIECEWISE),
# prefix caching and chunked prefill, with a token budget below every prompt.
DEFAULTS = {"enforce_eager": False, "enable_prefix_caching": True, "enable_chunked_prefill": True,
            "max_num_batched_tokens": CHUNK_BUDGET}  # fmt: skip
FULL_DECODE_ONLY = {
    "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
    "additional_config": {"ascend_compilation_config": {"enable_npugraph_ex": False}},
}
AGAIN = ("--rounds", "2")  # the prompts generated twice: the second time, prefix-cache hits
THEIRS = {"VLLM_NPU_EXT_CP_PATCH": "0"}  # vllm-ascend's own merge from the start
# name -> (engine args, baseline run, extra worker flags, extra environment, merges run).
# A full graph holds the merge captured at start, so at vLLM's defaults vllm-ascend's merge
# runs in an engine of its own (its results join the first's as that run's "vllm-ascend").
ENGINES = {
    "tp1": ({}, None, (), {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ()),
    "tp1 stock": ({}, None, ("--stock",), {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ()),
    "pcp2 eager": ({"prefill_context_parallel_size": 2}, "tp1", (), {}, MERGES),
    "dcp2 eager": ({"tensor_parallel_size": 2, "decode_context_parallel_size": 2}, "tp2", (), {},
                   MERGES),
    "pcp2 default": ({"prefill_context_parallel_size": 2, **DEFAULTS}, "tp1", AGAIN, {},
                     ("ours",)),
    "pcp2 default, theirs": ({"prefill_context_parallel_size": 2, **DEFAULTS}, None, AGAIN,
                             THEIRS, ("vllm-ascend",)),
    "dcp2 default": ({"tensor_parallel_size": 2, "decode_context_parallel_size": 2,
                      **DEFAULTS}, "tp2", AGAIN, {}, ("ours",)),
    "dcp2 default, theirs": ({"tensor_parallel_size": 2, "decode_context_parallel_size": 2,
                              **DEFAULTS}, None, AGAIN, THEIRS, ("vllm-ascend",)),
    # FULL_DECODE_ONLY with npugraph_ex off (vllm-ascend's default for it compiles with
    # npugraph_ex, which the stand-in does not emulate): one unsplit graph per decode size.
    "dcp2 full decode only": ({"tensor_parallel_size": 2, "decode_context_parallel_size": 2,
                               **DEFAULTS, **FULL_DECODE_ONLY}, "tp2", (), {}, ("ours",)),
    "dcp2 full decode only, theirs": ({"tensor_parallel_size": 2,
                                       "decode_context_parallel_size": 2, **DEFAULTS,
                                       **FULL_DECODE_ONLY}, None, (), THEIRS, ("vllm-ascend",)),
    # `SHORT` prompts, compared with the TP 2 server's answers to them
    "dcp2 interleave 16": ({"tensor_parallel_size": 2, "decode_context_parallel_size": 2,
                            "cp_kv_cache_interleave_size": INTERLEAVE, **DEFAULTS,
                            "max_num_batched_tokens": SHORT_BUDGET, "max_num_seqs": 8}, None, (),
                           {}, ("ours",)),
}  # fmt: skip
# name -> the server's arguments after the checkpoint, as a user gives them (`vllm-npu-ext serve`
# generates with CP; vLLM's defaults otherwise), besides `SERVER_TEST_FLAGS`.
SERVERS = {"tp2": ["-tp", "2", "--runner", "generate"],
           "dcp2 default (server)": ["-tp", "2", "-dcp", "2"],
           "pcp2 default (server)": ["-pcp", "2"]}
# name -> (baseline, what its log shows of its CP size: vLLM 0.23's config line names DCP but
# not PCP, whose workers are named by their PCP rank)
CP_SERVERS = {"dcp2 default (server)": ("tp2", "decode_context_parallel_size=2"),
              "pcp2 default (server)": ("tp1", "(Worker_PCP1 pid=")}
CP_RUNS = {**{n: s[0] for n, s in CP_SERVERS.items()},
           **{n: e[1] for n, e in ENGINES.items() if e[1]}}
EAGER_RUNS = [name for name in CP_RUNS if "eager" in name]
DEFAULT_RUNS = [name for name in CP_RUNS if name.endswith("default")]
# Runs whose vllm-ascend merge ran in an engine of its own (a full graph keeps what it captured).
FULL_GRAPH_RUNS = [name for name in CP_RUNS if f"{name}, theirs" in ENGINES]
BAD_COMPLETIONS = {
    "longer than max-model-len": {"prompt": [[5] * (MAX_MODEL_LEN + 100)], "max_tokens": 4},
    "negative max_tokens": {"prompt": "context", "max_tokens": -1},
    "token id outside the vocabulary": {"prompt": [[3, 10**9]], "max_tokens": 4},
    "temperature not a number": {"prompt": "context", "temperature": "hot"},
}


class Runs:
    """The two servers, queried and stopped, then the engine runs (module docstring)."""

    def __init__(self, root, model_dir):
        self.model_dir, self.token_ids = model_dir, prompts(model_dir)
        self.short_ids = [self.token_ids[prompt][:length] for prompt, length in SHORT]
        template = root / "chat.jinja"
        template.write_text(CHAT_TEMPLATE)
        self.root, self.template, self.results, self.seconds = root, template, {}, {}
        with ThreadPoolExecutor(2) as pool:
            servers = pool.submit(self._servers)
            engines = [pool.submit(self._engine, name) for name in ENGINES]
            servers.result()
            for future in engines:
                future.result()
        for name in FULL_GRAPH_RUNS:  # vllm-ascend's merge, from its own engine
            theirs = self.results.pop(f"{name}, theirs")
            for merge in theirs["runs"]:
                self.results[name]["runs"][merge] = theirs["runs"][merge]
            self.results[name]["theirs"] = theirs

    def _engine(self, name):
        engine_args, _, flags, env, merges = ENGINES[name]
        env = {**env, "VLLM_PORT": vllm_port("cp_decode", 2 + list(ENGINES).index(name))}
        began = time.monotonic()
        merges = ("--merges", ",".join(merges)) if merges else ()
        token_ids = self.short_ids if "interleave" in name else self.token_ids
        process, out, log = start_engine(name.replace(" ", "_").replace(",", ""),
                                         self.model_dir, self.root, token_ids, engine_args,
                                         *flags, *merges, **env)  # fmt: skip
        code = process.wait(timeout=1200)
        assert code == 0, log.read_text(errors="replace")[-6000:]
        self.results[name] = json.loads(out.read_text())
        self.seconds[name] = time.monotonic() - began

    def _servers(self):
        """One after the other (a TP 2 server is four processes): each queried, then stopped."""
        flags = [str(self.model_dir), *SERVER_TEST_FLAGS, "--chat-template", str(self.template)]
        for index, (name, args) in enumerate(SERVERS.items()):
            began = time.monotonic()
            env = server_env(VLLM_SERVER_DEV_MODE="1", VLLM_PORT=vllm_port("cp_decode", index),
                             VLLM_NPU_EXT_EMULATE_DEVICE_MIB=SERVER_DEVICE_MIB)  # fmt: skip
            server = Server([*flags, *args], self.root / f"{name.split()[0]}.log", env)
            try:
                server.wait_healthy(900)
                self.results[name] = self._query(server, cp=name in CP_SERVERS)
                # While serving: stopping the engine logs its own EngineDeadError traceback.
                self.results[name]["log"] = server.log_text()
            finally:
                server.stop()
            self.seconds[name] = time.monotonic() - began

    def _query(self, server, cp: bool) -> dict:
        url = server.base_url
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]

        def rpc(method, *args):
            body = {"method": method, "args": [str(a) for a in args]}
            return httpx.post(f"{url}/collective_rpc", json=body, timeout=300).json()["results"]

        forced = [forced_token(self.token_ids)]  # as the engines generate (support/cp_decode)

        def completions(token_ids=self.token_ids):
            body = {"model": model, "prompt": token_ids, "max_tokens": MAX_TOKENS,
                    "temperature": 0, "logprobs": 2, "return_tokens_as_token_ids": True,
                    "ignore_eos": True, "allowed_token_ids": forced}  # fmt: skip
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
            return from_completion(response.json()["choices"])

        # Our merge: it is what the server's full decode graphs captured at start.
        merge = "ours" if cp else "none"
        rpc("cp_probe_install", cp)
        rpc("cp_probe_reset")
        result = {"runs": {merge: {**completions(), "workers": rpc("cp_probe_counts")}}}
        result["chat"] = httpx.post(f"{url}/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": prompt_text(260, 9)}],
            "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": True, "top_logprobs": 2,
            "return_tokens_as_token_ids": True, "allowed_token_ids": forced},
            timeout=600).json()  # fmt: skip
        result["chat_workers"] = rpc("cp_probe_counts")  # the largest logit, chat included
        result["bad"] = {name: httpx.post(f"{url}/v1/completions", json={"model": model, **body},
                                          timeout=60).status_code
                         for name, body in BAD_COMPLETIONS.items()}  # fmt: skip
        result["malformed"] = httpx.post(
            f"{url}/v1/completions", content=b'{"prompt": ["x"',
            headers={"content-type": "application/json"}, timeout=60,
        ).status_code  # fmt: skip
        if not cp:  # the baseline of the short requests' CP engine
            rpc("cp_probe_reset")
            result["short"] = {**completions(self.short_ids), "workers": rpc("cp_probe_counts")}
        return result


@pytest.fixture(scope="module")
def runs(vllm_ascend_started, tmp_path_factory):
    from vllm_npu_ext.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("cp_decode")
    began = time.monotonic()
    model_dir = make_tiny_model(root / "model", preset="cp", max_position_embeddings=MAX_MODEL_LEN)
    started = Runs(root, model_dir)
    print(f"CP decode runs: {time.monotonic() - began:.0f} s wall; {started.seconds}")
    return started.results


def run_of(runs, name, merge):
    return runs[name]["runs"][merge]


def merges_of(name):
    """Our merge and vllm-ascend's; at vLLM's defaults also each one's second round; the CP
    server ours (what its full decode graphs captured)."""
    if name in SERVERS:
        return ("ours",)
    if name in DEFAULT_RUNS:
        return (*MERGES, *(f"{m}, again" for m in MERGES))
    return MERGES if name in FULL_GRAPH_RUNS else ENGINES[name][4]


@pytest.mark.parametrize("name", CP_RUNS)
def test_cp_generation_equals_the_non_cp_baseline_where_the_margin_is_clear(runs, name):
    baseline = run_of(runs, CP_RUNS[name], "none")
    for merge in merges_of(name):
        run = run_of(runs, name, merge)
        largest = largest_logit(run["workers"], baseline["workers"])
        result = compare(run, baseline, largest)
        print(f"{name}, {merge} merge vs {CP_RUNS[name]}: {result.compared} steps compared, "
              f"{result.clear} clear, worst |d logprob| {result.worst_logprob:.4f} "
              f"(bound {result.bound:.4f})")  # fmt: skip
        assert result.agrees, result
        assert result.compared == len(PROMPT_TOKENS) * MAX_TOKENS, result  # every step
        assert result.clear >= MAX_TOKENS, result  # the top-1 check not vacuous


@pytest.mark.parametrize("name", [n for n in CP_RUNS if n not in SERVERS
                                  and (n in FULL_GRAPH_RUNS or ENGINES[n][4] == MERGES)])
def test_our_merge_and_vllm_ascends_generate_alike(runs, name):
    """In one engine (eager), or each in an engine of its own (full graphs)."""
    for again in ("", ", again") if name in DEFAULT_RUNS else ("",):
        ours, theirs = run_of(runs, name, "ours" + again), run_of(runs, name, "vllm-ascend" + again)
        result = compare(ours, theirs, largest_logit(ours["workers"], theirs["workers"]))
        print(f"{name}{again}: ours vs vllm-ascend's merge: worst |d logprob| "
              f"{result.worst_logprob}")  # fmt: skip
        assert result.agrees and result.compared == len(PROMPT_TOKENS) * MAX_TOKENS, result


@pytest.mark.parametrize("name", EAGER_RUNS)
def test_every_decode_step_ran_paged_fia_and_our_merge_in_every_worker(runs, name):
    """Read from each worker's probes: per layer per decode step one paged FIA call and at
    least one call of our operator (prefill's merges are ours too); vllm-ascend's TensorList
    AttentionUpdate never with the patch on, once per layer-step in decode with it off; -1
    slots in ReshapeAndCache."""
    layers = 2
    for merge in MERGES:
        for worker in run_of(runs, name, merge)["workers"]:
            steps = worker["CP decode layer-steps"]
            assert steps % layers == 0 and steps >= layers * (MAX_TOKENS - 1), worker
            assert worker["paged FIA"] == worker["npu_fused_infer_attention_score in CP decode"]
            assert worker["npu_fused_infer_attention_score in CP decode"] == steps, worker
            assert worker["negative slots"] > 0, worker
            assert worker["merge patched"] is (merge == "ours"), worker
            if merge == "ours":  # decode's merges and prefill's (PCP's halves): ours
                assert worker["our CANN operator"] >= steps, worker
                assert worker.get("npu_attention_update", 0) == 0, worker
            else:
                assert worker["our CANN operator"] == 0, worker
                assert worker.get("npu_attention_update in CP decode", 0) == steps, worker


@pytest.mark.parametrize("name", DEFAULT_RUNS)
def test_engines_at_vllms_defaults_decode_in_full_graphs_with_the_merge_inside(runs, name):
    """At vLLM's defaults (no enforce_eager, no compilation override, async scheduling) decode
    runs in vllm-ascend's full decode graphs (FULL_AND_PIECEWISE): paged FIA captured in a
    task group with the merge after it, FIA's key counts updated before each replay
    (`AscendAttentionCPImpl.update_graph_params`, `_forward_decode_pcp_dcp`), the CP collectives
    replayed inside. Read from each
    worker: full-graph replays with FIA task updates; with our patch, our operator captured
    in the decode graphs and run in every decode step, torch_npu's TensorList AttentionUpdate
    never captured nor called (chunked prefill's merges and PCP's included); vllm-ascend's
    merge (patch off from the start) the other way round."""
    layers = 2
    run = runs[name]
    assert run["cudagraph_mode"] == "FULL_AND_PIECEWISE" and run["async_scheduling"] is True
    assert run["theirs"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    for merge in merges_of(name):
        ours = merge.startswith("ours")
        for worker in run_of(runs, name, merge)["workers"]:
            assert worker["merge patched"] is ours, worker
            assert worker["FIA task updates"] >= layers, worker  # full decode graphs replayed
            assert worker["FIA task updates"] % layers == 0, worker
            assert worker["negative slots"] > 0, worker
            captured_ours = worker["captured: our operator"]
            captured_list = worker["captured: TensorList npu_attention_update"]
            print(f"{name}, {merge} merge, a worker: {worker['graph replays']} graph replays, "
                  f"{worker['FIA task updates']} FIA task updates, captured: ours "
                  f"{captured_ours}, TensorList {captured_list}; our operator run "
                  f"{worker['our CANN operator']} times")  # fmt: skip
            if ours:  # every merge ours: decode in the graphs, prefill's between them
                assert captured_ours >= layers and captured_list == 0, worker
                assert worker.get("npu_attention_update", 0) == 0, worker
                # every decode step: replayed in a full graph or run between piecewise ones
                assert worker["our CANN operator"] >= layers * (MAX_TOKENS - 1), worker
            else:
                assert captured_list >= layers and captured_ours == 0, worker
                assert worker["our CANN operator"] == 0, worker


def test_full_decode_only_decodes_in_one_graph_per_size_with_our_merge_inside(runs):
    """FULL_DECODE_ONLY (npugraph_ex off): no piecewise graphs, prefill eager, decode in full
    graphs of the whole model. Read from each worker: full-graph replays with FIA task
    updates, with our patch our operator captured and run in every decode step, TensorList
    never captured; with vllm-ascend's merge (patch off from the start) the other way round."""
    layers, name = 2, "dcp2 full decode only"
    run = runs[name]
    assert run["cudagraph_mode"] == run["theirs"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert run["async_scheduling"] is True
    for merge in MERGES:
        ours = merge == "ours"
        for worker in run_of(runs, name, merge)["workers"]:
            print(f"{name}, {merge} merge, a worker: {worker['graph replays']} graph replays, "
                  f"{worker['FIA task updates']} FIA task updates, captured: ours "
                  f"{worker['captured: our operator']}, TensorList "
                  f"{worker['captured: TensorList npu_attention_update']}; our operator run "
                  f"{worker['our CANN operator']} times")  # fmt: skip
            assert worker["merge patched"] is ours, worker
            assert worker["graph replays"] >= MAX_TOKENS - 1, worker
            assert worker["FIA task updates"] == layers * worker["graph replays"], worker
            captured = (worker["captured: our operator"],
                        worker["captured: TensorList npu_attention_update"])  # fmt: skip
            assert captured[not ours] >= layers and captured[ours] == 0, worker
            assert (worker["our CANN operator"] >= layers * (MAX_TOKENS - 1)) is ours, worker


def test_requests_without_keys_on_a_rank_generate_as_without_cp(runs):
    """TP 2 DCP 2 at vLLM's defaults with cp_kv_cache_interleave_size 16, a 128-token budget
    and the `SHORT` prompts: rank 1 runs context FIA for a request without context there, and
    in most decode steps paged FIA for requests without keys there; FIA's result for those is
    undefined (the stand-in's: NaN rows). Our patch sends them as 0 / -inf: in the context
    chunk (its wrap of `_compute_prefill_context`) and in the full decode graphs (the masks the
    CP builder writes before each step). Tokens equal to the TP 2 server's wherever its margin
    is clear, logprobs within the bound. Read from the workers: the context chunk with such a
    request, full-graph replays with FIA task updates, the masked lse write captured, masks
    written every step, on rank 1 with a request without keys."""
    layers, name = 2, "dcp2 interleave 16"
    run, baseline = runs[name], runs["tp2"]["short"]
    assert run["cudagraph_mode"] == "FULL_AND_PIECEWISE" and run["async_scheduling"] is True
    ours = run_of(runs, name, "ours")
    result = compare(ours, baseline, largest_logit(ours["workers"], baseline["workers"]))
    print(f"{name} vs the TP 2 server, prompts {[n for _, n in SHORT]}: {result.compared} steps "
          f"compared, {result.clear} clear, worst |d logprob| {result.worst_logprob:.4f} "
          f"(bound {result.bound:.4f})")  # fmt: skip
    assert result.agrees and result.compared == len(SHORT) * MAX_TOKENS, result
    assert result.clear >= 3 * MAX_TOKENS, result
    for worker in ours["workers"]:
        print(f"{name}, a worker: {worker['graph replays']} graph replays, "
              f"{worker['FIA task updates']} FIA task updates, masked lse captured "
              f"{worker['captured: masked lse']}, masks written {worker['graph masks written']}"
              f" ({worker.get('graph masks written with a request without keys here', 0)} with a "
              f"request without keys here); context chunks {worker['context chunks']} "
              f"({worker.get('context chunks with a request without context here', 0)} with a "
              "request without context here)")  # fmt: skip
        assert worker["FIA task updates"] >= layers and worker["graph replays"] > 0, worker
        assert worker["captured: masked lse"] >= layers, worker
        assert worker["captured: our operator"] >= layers, worker
        assert worker["graph masks written"] >= MAX_TOKENS - 1, worker
    for probe, least in (("graph masks written with a request without keys here", MAX_TOKENS - 1),
                         ("context chunks with a request without context here", layers)):
        counts = sorted(worker.get(probe, 0) for worker in ours["workers"])
        assert counts[0] == 0 and counts[-1] >= least, (probe, counts)  # rank 1's, not rank 0's


@pytest.mark.parametrize("name", CP_SERVERS)
def test_the_cp_servers_at_vllms_defaults_decode_in_full_graphs_through_our_merge(runs, name):
    """`vllm-npu-ext serve CKPT -tp 2 -dcp 2` (and `-pcp 2`) and nothing else but the tests'
    probes: vLLM's defaults as its log states them (FULL_AND_PIECEWISE, prefix caching,
    chunked prefill, async scheduling). Read from each worker: decode replayed in full graphs
    with our operator captured and run in every decode step, torch_npu's TensorList operator
    never captured nor called, the 3100-token prompt's context read in chunks (its default
    budget is below it)."""
    layers, server, setting = 2, runs[name], CP_SERVERS[name][1]
    log = server["log"]
    config = log[log.index("Initializing a V1 LLM engine"):][:6000]
    for expected in ("enable_prefix_caching=True", "enable_chunked_prefill=True",
                     "FULL_AND_PIECEWISE"):  # fmt: skip
        assert expected in config, (expected, config)
    assert setting in log, setting
    assert "Asynchronous scheduling is enabled." in log
    assert server["chat"]["usage"]["completion_tokens"] == MAX_TOKENS, server["chat"]
    for worker in run_of(runs, name, "ours")["workers"]:
        print(f"{name}, a worker: {worker['graph replays']} graph replays, "
              f"{worker['FIA task updates']} FIA task updates, our operator captured "
              f"{worker['captured: our operator']} and run {worker['our CANN operator']} times, "
              f"{worker['KV loads for chunked context']} KV loads")  # fmt: skip
        assert worker["merge patched"] is True, worker
        assert worker["FIA task updates"] >= layers and worker["captured: our operator"] >= layers
        assert worker["captured: TensorList npu_attention_update"] == 0, worker
        assert worker.get("npu_attention_update", 0) == 0, worker
        assert worker["our CANN operator"] >= layers * (MAX_TOKENS - 1), worker
        assert worker["KV loads for chunked context"] > 0, worker


@pytest.mark.parametrize("name", DEFAULT_RUNS)
def test_engines_at_vllms_defaults_prefill_in_chunks_and_hit_the_prefix_cache(runs, name):
    """A token budget below every prompt: each rank reads its shard of a request's earlier
    chunks (chunked context) through ATB's paged cache load (`DeviceOperator.kv_cache_load`,
    `AscendAttentionCPImpl._load_kv_for_chunk`). The second prompt starts with the first's
    `SHARED_PREFIX`
    tokens, and the second round finds every prompt's full blocks cached: prefix-cache hits,
    whose context is read the same way. Equal tokens: the comparisons above."""
    for merge in MERGES:
        first, again = run_of(runs, name, merge), run_of(runs, name, f"{merge}, again")
        loads = [[worker["KV loads for chunked context"] for worker in run["workers"]]
                 for run in (first, again)]  # fmt: skip
        print(f"{name}, {merge} merge: cached tokens {first['cached_tokens']}, again "
              f"{again['cached_tokens']}; KV loads per worker {loads[0]}, again {loads[1]}")
        assert first["cached_tokens"][0] == 0 and first["cached_tokens"][1] >= SHARED_PREFIX
        hash_block = 128 * 2  # vLLM hashes blocks of block_size x dcp x pcp tokens under CP
        for cached, length in zip(again["cached_tokens"], PROMPT_TOKENS, strict=True):
            assert length - hash_block <= cached < length, again["cached_tokens"]
        assert all(count > 0 for run_loads in loads for count in run_loads), loads


@pytest.mark.parametrize("name", [n for n in EAGER_RUNS if n.startswith("pcp2")])
def test_pcp_engines_run_at_vllms_default_async_scheduling(runs, name):
    """Async scheduling on (vLLM's default, not overridden here), and the second generate, in
    input-batch rows the first one's requests left, gave vllm-ascend's PCP padding -1
    placeholder ids: our patch set them to 0 in the worker (else the embedding's IndexError)."""
    assert runs[name]["async_scheduling"] is True
    counts = [[worker["PCP placeholder ids set to 0"] for worker in run_of(runs, name, merge)[
        "workers"]] for merge in MERGES]  # per worker, counted since it started
    print(f"{name}: placeholder ids set to 0 per worker, after each generate: {counts}")
    assert all(after > before for before, after in zip(*counts, strict=True))


def test_generation_with_our_plugin_is_stock_vllm_ascends(runs):
    """Without CP, the plugin changes nothing of vllm-ascend's generation: the same tokens and
    the same logprobs, bit for bit, with decode on the paged cache in both."""
    ours, stock = run_of(runs, "tp1", "none"), run_of(runs, "tp1 stock", "none")
    assert ours["tokens"] == stock["tokens"] and ours["logprobs"] == stock["logprobs"]
    for run in (ours, stock):
        (worker,) = run["workers"]
        assert worker["paged FIA"] >= 2 * (MAX_TOKENS - 1) and not worker["attention_cp imported"]


def test_the_cp_servers_chat_answers_as_the_non_cp_servers(runs):
    """/v1/chat/completions of a 500-token message on both servers (their /v1/completions:
    `dcp2 default (server)` above), compared as the engines are."""
    cp_chat, chat = runs["dcp2 default (server)"]["chat"], runs["tp2"]["chat"]
    assert "choices" in cp_chat and "choices" in chat, (cp_chat, chat)
    assert cp_chat["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"] > 400
    largest = largest_logit(runs["dcp2 default (server)"]["chat_workers"],
                            runs["tp2"]["chat_workers"])  # fmt: skip
    result = compare(from_chat(cp_chat["choices"][0]), from_chat(chat["choices"][0]), largest)
    print(f"chat, DCP 2 server vs TP 2 server: {result}")
    assert result.agrees and result.compared == MAX_TOKENS, result
    assert "decode_context_parallel_size=2" in runs["dcp2 default (server)"]["log"]


@pytest.mark.parametrize("server", SERVERS)
def test_bad_requests_get_400_and_no_traceback(runs, server):
    result = runs[server]
    assert result["bad"] == dict.fromkeys(BAD_COMPLETIONS, 400) and result["malformed"] == 400
    assert "Traceback" not in result["log"]
