"""A probe that records the custom-op search paths inside every process of a vLLM server.

`probe_server_env(probe_dir)` writes into `probe_dir`:

- a vendor directory of ours (VLLM_NPU_EXT_OPP_PATH) providing NpuExtAttentionUpdate, an
  unrelated vendor directory, and a stand-in vllm-ascend package whose bundled vendor directory
  provides an operator of the same name. The stand-in's `__init__` raises ImportError: the
  bootstrap must only locate it (`find_spec`), never import it;
- two plugin modules and a `*.dist-info` registering them, so that vLLM loads them in every
  process it starts (API server, model inspection, EngineCore, workers). The platform-plugin
  module puts the stand-in vllm-ascend on sys.path inside vLLM's processes only (not in the
  `vllm-npu-ext serve` launcher, which checks for vllm-ascend to choose CPU defaults).

It returns the environment additions for the server: PYTHONPATH with `probe_dir`, and
ASCEND_CUSTOM_OPP_PATH / LD_LIBRARY_PATH with vllm-ascend's directory early, ours late, plus
an empty and a relative entry.

Why the probe can catch a process where our bootstrap did not run: a child process inherits
its parent's already reordered environment, so looking at the variables proves nothing about
the child itself. The `vllm.platform_plugins` probe module therefore resets both variables to
the crafted, unordered values when vLLM imports it (keeping the inherited values for the
record). vLLM imports every platform plugin module before it calls any platform plugin
function, so the reset always precedes our `platform_plugin()` in that process, whatever the
discovery order of the entry points (it depends on sys.path and the working directory). Each
process thus starts as one whose parent never ran the bootstrap (a launcher that rebuilds the
environment, a Ray worker).

The `vllm.general_plugins` probe module snapshots the variables when vLLM imports it: after the
platform plugins, before any general plugin function, our `register()` included; so that
snapshot shows what the platform plugin alone did. Its function then does what vllm-ascend's
NPUPlatform does in each process (`_prepend_env_path` of its vendor directory: insert unless
the exact string is present) and writes `records/<pid>.json` with three snapshots:
`inherited` (from the parent: what the dynamic loader of a child uses, since the loader reads
LD_LIBRARY_PATH once, at process start), `at_general_plugin_load`, and the final values.

Other packages prepend to LD_LIBRARY_PATH too: opencv's `cv2/__init__.py` adds its `lib64` in
every vLLM process, between the platform plugins and the general plugins (seen here), and on
vLLM 0.23 the API server imports it again after `register()`, before it spawns the engine. So
the checks compare the relative order of the crafted entries, and in what a child inherits,
that no entry ahead of vllm-ascend's provides `libcust_opapi.so` (each crafted vendor
directory ships one, as a real package does).
"""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

OP_TYPE = "NpuExtAttentionUpdate"
DIST_INFO = "npu_ext_bootstrap_probe-0.0.dist-info"
RESET_MODULE = "npu_ext_probe_reset"
RECORD_MODULE = "npu_ext_probe_record"
VARIABLES = ("ASCEND_CUSTOM_OPP_PATH", "LD_LIBRARY_PATH")
# The op API library every CANN custom op package ships (vllm_npu_ext.bootstrap, docstring).
SONAME = "libcust_opapi.so"
RELATIVE_ENTRY = "relative/opp"

RESET_SOURCE = '''\
"""vllm.platform_plugins probe: each process starts from the unordered variables."""
import os
import sys

START = {start!r}
STAND_IN_ROOT = {stand_in_root!r}

INHERITED = {{name: os.environ.get(name) for name in START}}
os.environ.update(START)
if STAND_IN_ROOT not in sys.path:
    sys.path.append(STAND_IN_ROOT)


def claim_nothing():
    return None
'''

RECORD_SOURCE = '''\
"""vllm.general_plugins probe: records the search paths of this process."""
import json
import multiprocessing
import os
import sys

VARIABLES = {variables!r}
VLLM_ASCEND_VENDOR_DIR = {vllm_ascend_vendor_dir!r}
VLLM_ASCEND_LIB_DIR = {vllm_ascend_lib_dir!r}
RECORDS = {records!r}
RESET_MODULE = {reset_module!r}


def _snapshot():
    return {{name: os.environ.get(name) for name in VARIABLES}}


def _platform_resolved():
    platforms = sys.modules.get("vllm.platforms")
    return getattr(platforms, "_current_platform", None) is not None


AT_LOAD = _snapshot()
PLATFORM_RESOLVED_AT_LOAD = _platform_resolved()
INHERITED = getattr(sys.modules.get(RESET_MODULE), "INHERITED", None)


def _prepend_like_vllm_ascend(name, path):
    entries = [entry for entry in os.environ.get(name, "").split(":") if entry]
    if path not in entries:
        os.environ[name] = ":".join([path, *entries])


def _title():
    try:
        import setproctitle
    except ImportError:
        return " ".join(sys.argv)
    return setproctitle.getproctitle()


def record():
    _prepend_like_vllm_ascend("ASCEND_CUSTOM_OPP_PATH", VLLM_ASCEND_VENDOR_DIR)
    _prepend_like_vllm_ascend("LD_LIBRARY_PATH", VLLM_ASCEND_LIB_DIR)
    data = {{
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "process_name": multiprocessing.current_process().name,
        "title": _title(),
        "argv": sys.argv,
        "platform_resolved_at_load": PLATFORM_RESOLVED_AT_LOAD,
        "inherited": INHERITED,
        "at_general_plugin_load": AT_LOAD,
        **_snapshot(),
    }}
    os.makedirs(RECORDS, exist_ok=True)
    path = os.path.join(RECORDS, f"{{os.getpid()}}.json")
    with open(path + ".tmp", "w") as file:
        json.dump(data, file, indent=1)
    os.replace(path + ".tmp", path)
'''


def our_vendor_dir(probe_dir: Path) -> Path:
    return probe_dir / "opp" / "vendors" / "vllm_npu_ext"


def other_vendor_dir(probe_dir: Path) -> Path:
    return probe_dir / "opp" / "vendors" / "customize"


def vllm_ascend_vendor_dir(probe_dir: Path) -> Path:
    """The stand-in vllm-ascend's bundled vendor directory, spelled as vllm-ascend spells it."""
    return stand_in_vendor_dir(probe_dir / "stand_in")


def stand_in_vendor_dir(site_dir: Path) -> Path:
    return site_dir / "vllm_ascend" / "_cann_ops_custom" / "vendors" / "custom_transformer"


def make_stand_in_vllm_ascend(site_dir: Path, op_types: list[str]) -> Path:
    """A `vllm_ascend` package under `site_dir` that can be located but not imported.

    Returns its bundled vendor directory, which provides `op_types`.
    """
    vendor_dir = make_vendor_dir(stand_in_vendor_dir(site_dir), op_types)
    (site_dir / "vllm_ascend" / "__init__.py").write_text(
        'raise ImportError("stand-in vllm_ascend: locate it, never import it")\n', encoding="utf-8"
    )
    return vendor_dir


@contextlib.contextmanager
def restored_environ(names: tuple[str, ...]) -> Iterator[None]:
    """Restore the variables afterwards, whoever changed them (monkeypatch restores its own)."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def lib_dir(vendor_dir: Path | str) -> Path:
    return Path(vendor_dir) / "op_api" / "lib"


def make_vendor_dir(
    vendor_dir: Path, op_types: list[str], aclnn_names: tuple[str, ...] = ()
) -> Path:
    """A CANN vendor directory providing `op_types` (ops-info json) and aclnn headers."""
    config = vendor_dir / "op_impl" / "ai_core" / "tbe" / "config" / "ascend910b"
    config.mkdir(parents=True, exist_ok=True)
    ops_info = {op: {"opFile": {"value": op.lower()}} for op in op_types}
    (config / "aic-ascend910b-ops-info.json").write_text(json.dumps(ops_info), encoding="utf-8")
    include = vendor_dir / "op_api" / "include"
    include.mkdir(parents=True, exist_ok=True)
    for name in aclnn_names:
        (include / f"aclnn_{name}.h").write_text(f"// aclnn {name}\n", encoding="utf-8")
    lib_dir(vendor_dir).mkdir(parents=True, exist_ok=True)
    (lib_dir(vendor_dir) / SONAME).touch()
    return vendor_dir


def crafted_paths(probe_dir: Path) -> dict[str, str]:
    """vllm-ascend's entries early, ours late, an empty and a relative entry in the OPP path."""
    ours, other = our_vendor_dir(probe_dir), other_vendor_dir(probe_dir)
    theirs = vllm_ascend_vendor_dir(probe_dir)
    inherited_libs = [entry for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":") if entry]
    return {
        "ASCEND_CUSTOM_OPP_PATH": ":".join(
            [str(theirs), str(other), "", RELATIVE_ENTRY, str(ours), str(other)]
        ),
        "LD_LIBRARY_PATH": ":".join(
            [str(lib_dir(theirs)), *inherited_libs, str(lib_dir(other)), str(lib_dir(ours))]
        ),
    }


def _write_plugins(probe_dir: Path) -> None:
    theirs = vllm_ascend_vendor_dir(probe_dir)
    reset = RESET_SOURCE.format(
        start=crafted_paths(probe_dir), stand_in_root=str(probe_dir / "stand_in")
    )
    record = RECORD_SOURCE.format(
        variables=VARIABLES,
        vllm_ascend_vendor_dir=str(theirs),
        vllm_ascend_lib_dir=str(lib_dir(theirs)),
        records=str(probe_dir / "records"),
        reset_module=RESET_MODULE,
    )
    (probe_dir / f"{RESET_MODULE}.py").write_text(reset, encoding="utf-8")
    (probe_dir / f"{RECORD_MODULE}.py").write_text(record, encoding="utf-8")
    dist_info = probe_dir / DIST_INFO
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: npu-ext-bootstrap-probe\nVersion: 0.0\n", encoding="utf-8"
    )
    (dist_info / "entry_points.txt").write_text(
        textwrap.dedent(f"""\
            [vllm.platform_plugins]
            npu_ext_probe_reset = {RESET_MODULE}:claim_nothing

            [vllm.general_plugins]
            npu_ext_probe_record = {RECORD_MODULE}:record
            """),
        encoding="utf-8",
    )


def probe_server_env(probe_dir: Path) -> dict[str, str]:
    """Write the probe into `probe_dir`; the environment additions for the server.

    VLLM_PLUGINS must stay unset in the server's environment, or vLLM skips the probe.
    """
    probe_dir = Path(probe_dir).resolve()
    probe_dir.mkdir(parents=True, exist_ok=True)
    make_vendor_dir(our_vendor_dir(probe_dir), [OP_TYPE], ("npu_ext_attention_update",))
    make_vendor_dir(other_vendor_dir(probe_dir), ["SomethingElse"])
    make_stand_in_vllm_ascend(probe_dir / "stand_in", [OP_TYPE, "AttentionUpdate"])
    _write_plugins(probe_dir)
    python_path = [str(probe_dir), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    return {
        "PYTHONPATH": ":".join(python_path),
        "VLLM_NPU_EXT_OPP_PATH": str(our_vendor_dir(probe_dir)),
        "VLLM_NPU_EXT_BOOTSTRAP": "1",
        **crafted_paths(probe_dir),
    }


def read_records(probe_dir: Path) -> list[dict]:
    """Every process's record, in pid order."""
    records_dir = Path(probe_dir) / "records"
    paths = sorted(records_dir.glob("*.json"), key=lambda path: int(path.stem))
    return [json.loads(path.read_text(encoding="utf-8")) for path in paths]
