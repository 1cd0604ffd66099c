"""The custom-op bootstrap: the pure reordering (property tests) and `apply()` on real dirs."""

from __future__ import annotations

import logging
import os
import sys

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.bootstrap_probe import (
    OP_TYPE,
    lib_dir,
    make_stand_in_vllm_ascend,
    make_vendor_dir,
    restored_environ,
)

import vllm_npu_ext
from vllm_npu_ext import bootstrap

SEARCH_PATH_VARIABLES = (bootstrap.OPP_PATH_VARIABLE, bootstrap.LIBRARY_PATH_VARIABLE)


def vllm_ascend_prepend(env: dict[str, str], env_name: str, path: str) -> None:
    """vllm-ascend 0.23.0.post1's `_prepend_env_path` (vllm_ascend/utils.py), on a dict."""
    current_value = env.get(env_name, "")
    path_entries = [entry for entry in current_value.split(":") if entry]
    if path not in path_entries:
        path_entries.insert(0, path)
        env[env_name] = ":".join(path_entries)


def resolved(entries: list[str]) -> list[str]:
    return [os.path.realpath(entry) for entry in entries]


# Spellings that collide after resolution ("/r/a", "/r/a/", "/r//a", "/r/b/../a").
SEGMENTS = st.sampled_from(["a", "b", "c", ".", "..", ""])
ABSOLUTE = st.lists(SEGMENTS, min_size=1, max_size=3).map(lambda parts: "/r/" + "/".join(parts))
RELATIVE = st.sampled_from(["", "rel", "./x", "../y", "a/b", "."])
VALUES = st.one_of(st.none(), st.lists(st.one_of(ABSOLUTE, RELATIVE), max_size=8).map(":".join))
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)


def distinct(ours: str, theirs: str) -> None:
    """Our vendor directory is never vllm-ascend's own."""
    assume(os.path.realpath(ours) != os.path.realpath(theirs))


@PROPERTY_SETTINGS
@given(value=VALUES, ours=ABSOLUTE, theirs=ABSOLUTE)
def test_ours_come_first_then_vllm_ascend(value, ours, theirs):
    distinct(ours, theirs)
    entries = bootstrap.reorder_search_path(value, [ours], [theirs]).value.split(":")
    assert entries[:2] == [ours, theirs]


@PROPERTY_SETTINGS
@given(value=VALUES, ours=ABSOLUTE, theirs=ABSOLUTE)
def test_reordering_is_idempotent(value, ours, theirs):
    once = bootstrap.reorder_search_path(value, [ours], [theirs])
    twice = bootstrap.reorder_search_path(once.value, [ours], [theirs])
    assert twice == bootstrap.Reordered(once.value, ())


@PROPERTY_SETTINGS
@given(value=VALUES, ours=ABSOLUTE, theirs=ABSOLUTE)
def test_no_duplicates_and_no_empty_or_relative_entries(value, ours, theirs):
    entries = bootstrap.reorder_search_path(value, [ours], [theirs]).value.split(":")
    assert all(entry and os.path.isabs(entry) for entry in entries)
    assert len(set(resolved(entries))) == len(entries)


@PROPERTY_SETTINGS
@given(value=VALUES, ours=ABSOLUTE, theirs=ABSOLUTE)
def test_dropped_names_exactly_the_empty_and_relative_entries(value, ours, theirs):
    dropped = bootstrap.reorder_search_path(value, [ours], [theirs]).dropped
    original = value.split(":") if value else []
    assert dropped == tuple(entry for entry in original if not os.path.isabs(entry))


@PROPERTY_SETTINGS
@given(value=VALUES, ours=ABSOLUTE, theirs=ABSOLUTE)
def test_other_entries_keep_their_relative_order(value, ours, theirs):
    entries = bootstrap.reorder_search_path(value, [ours], [theirs]).value.split(":")
    special = set(resolved([ours, theirs]))
    others = [key for key in resolved(entries) if key not in special]
    original = [e for e in (value.split(":") if value else []) if os.path.isabs(e)]
    expected = [key for key in resolved(original) if key not in special]
    assert others == list(dict.fromkeys(expected))


@PROPERTY_SETTINGS
@given(value=VALUES, ours=ABSOLUTE, theirs=ABSOLUTE)
def test_vllm_ascend_prepend_afterwards_leaves_ours_first(value, ours, theirs):
    distinct(ours, theirs)
    env = {"ASCEND_CUSTOM_OPP_PATH": bootstrap.reorder_search_path(value, [ours], [theirs]).value}
    before = dict(env)
    vllm_ascend_prepend(env, "ASCEND_CUSTOM_OPP_PATH", theirs)
    assert env == before
    assert env["ASCEND_CUSTOM_OPP_PATH"].split(":")[0] == ours
    assert (
        bootstrap.vllm_ascend_prepend(before["ASCEND_CUSTOM_OPP_PATH"], theirs)
        == env["ASCEND_CUSTOM_OPP_PATH"]
    )


def test_without_vllm_ascend_second_its_prepend_would_win():
    """Why its directory goes second: absent, vllm-ascend's prepend puts it before ours."""
    env = {"ASCEND_CUSTOM_OPP_PATH": bootstrap.reorder_search_path("/x", ["/ours"]).value}
    vllm_ascend_prepend(env, "ASCEND_CUSTOM_OPP_PATH", "/theirs")
    assert env["ASCEND_CUSTOM_OPP_PATH"] == "/theirs:/ours:/x"


def test_duplicates_are_compared_by_resolved_path(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    value = f"{tmp_path / 'link'}:/other:{real}"
    assert bootstrap.reorder_search_path(value, [str(real)]).value == f"{real}:/other"


@pytest.mark.parametrize("argument", ["first", "second"])
def test_relative_own_entries_are_rejected(argument):
    with pytest.raises(ValueError, match=argument):
        bootstrap.reorder_search_path("/a", **{"first": ["/ours"], argument: ["relative"]})


# --- apply() on real directories -------------------------------------------------------------


@pytest.fixture
def search_path_env(monkeypatch, tmp_path):
    """Restores both search-path variables afterwards, whoever changed them; no default install."""
    monkeypatch.setattr(bootstrap, "default_vendor_dir", lambda: tmp_path / "no_default_install")
    monkeypatch.setattr(bootstrap, "_announced_in_pid", None)
    monkeypatch.setattr(bootstrap, "_warned", set())
    for name in ("VLLM_NPU_EXT_OPP_PATH", "VLLM_NPU_EXT_BOOTSTRAP"):
        monkeypatch.delenv(name, raising=False)
    with restored_environ(SEARCH_PATH_VARIABLES):
        # Start empty: modules imported earlier in this process (cv2) prepend their own.
        for name in SEARCH_PATH_VARIABLES:
            os.environ.pop(name, None)
        yield


@pytest.fixture
def stand_in_vllm_ascend(tmp_path, monkeypatch):
    """A locatable vllm_ascend (never imported) with its bundled vendor directory."""
    vendor_dir = make_stand_in_vllm_ascend(tmp_path / "site", [OP_TYPE])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return str(vendor_dir)


@pytest.fixture
def ours(tmp_path):
    return str(make_vendor_dir(tmp_path / "opp" / "vendors" / "vllm_npu_ext", [OP_TYPE]))


@pytest.fixture
def log_records():
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.DEBUG)
    handler.emit = records.append
    logger = logging.getLogger(f"vllm.{bootstrap.LOGGER_NAME}")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_vllm_ascend_vendor_dir_is_found_without_importing_it(
    search_path_env, stand_in_vllm_ascend
):
    assert bootstrap.vllm_ascend_vendor_dir() == stand_in_vllm_ascend
    assert "vllm_ascend" not in sys.modules


def test_apply_puts_ours_first_then_vllm_ascend(
    search_path_env, stand_in_vllm_ascend, ours, monkeypatch
):
    monkeypatch.setenv("VLLM_NPU_EXT_OPP_PATH", ours)
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", f"{stand_in_vllm_ascend}:/other::rel:{ours}")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/usr/lib/x:{lib_dir(ours)}")
    changes = bootstrap.apply()
    assert [change.split("=")[0] for change in changes] == list(SEARCH_PATH_VARIABLES)
    assert os.environ["ASCEND_CUSTOM_OPP_PATH"] == f"{ours}:{stand_in_vllm_ascend}:/other"
    their_lib = lib_dir(stand_in_vllm_ascend)
    # Libraries the other way round: vllm-ascend's extension finds its libcust_opapi.so by name.
    assert os.environ["LD_LIBRARY_PATH"] == f"{their_lib}:{lib_dir(ours)}:/usr/lib/x"
    assert bootstrap.apply() == []


def test_apply_uses_the_default_install_when_present(search_path_env, ours, monkeypatch):
    monkeypatch.setattr(bootstrap, "default_vendor_dir", lambda: ours)
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", f"/other:{ours}")
    bootstrap.apply()
    assert os.environ["ASCEND_CUSTOM_OPP_PATH"] == f"{ours}:/other"


@pytest.mark.parametrize(
    "settings_",
    [
        pytest.param({}, id="no-package-installed"),
        pytest.param({"VLLM_NPU_EXT_BOOTSTRAP": "0", "VLLM_NPU_EXT_OPP_PATH": "{ours}"}, id="off"),
        pytest.param({"VLLM_NPU_EXT_OPP_PATH": "relative/opp"}, id="relative-override"),
        pytest.param({"VLLM_NPU_EXT_OPP_PATH": "/does/not/exist"}, id="missing-override"),
    ],
)
def test_apply_changes_nothing(search_path_env, ours, monkeypatch, settings_):
    for name, value in settings_.items():
        monkeypatch.setenv(name, value.format(ours=ours))
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", f"/other::{ours}")
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert bootstrap.apply() == []
    assert os.environ["ASCEND_CUSTOM_OPP_PATH"] == f"/other::{ours}"
    assert "LD_LIBRARY_PATH" not in os.environ


def test_apply_logs_one_info_line_per_process_and_names_dropped_entries(
    search_path_env, ours, monkeypatch, log_records
):
    monkeypatch.setenv("VLLM_NPU_EXT_OPP_PATH", ours)
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", f"/other::relative/opp:{ours}")
    bootstrap.apply()
    os.environ["ASCEND_CUSTOM_OPP_PATH"] = f"/other:{ours}"  # something reorders it again
    assert bootstrap.apply() != []
    infos = [r for r in log_records if r.levelno == logging.INFO]
    warnings = [r.getMessage() for r in log_records if r.levelno == logging.WARNING]
    assert len(infos) == 1 and str(os.getpid()) in infos[0].getMessage()
    assert len(warnings) == 1 and "'', 'relative/opp'" in warnings[0]


def test_platform_plugin_claims_no_platform_and_reorders(search_path_env, ours, monkeypatch):
    monkeypatch.setenv("VLLM_NPU_EXT_OPP_PATH", ours)
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", f"/other:{ours}")
    assert bootstrap.platform_plugin() is None
    assert os.environ["ASCEND_CUSTOM_OPP_PATH"] == f"{ours}:/other"


def test_register_applies_the_bootstrap(search_path_env, ours, monkeypatch):
    monkeypatch.setattr(vllm_npu_ext, "_registered_in_pid", None)
    for name in ("VLLM_NPU_EXT_MODEL_OVERRIDE", "VLLM_NPU_EXT_CP_PATCH"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("VLLM_NPU_EXT_OPP_PATH", ours)
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", f"/other:{ours}")
    vllm_npu_ext.register()
    assert os.environ["ASCEND_CUSTOM_OPP_PATH"] == f"{ours}:/other"
