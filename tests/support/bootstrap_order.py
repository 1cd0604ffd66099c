"""The order the custom-op bootstrap must give the search paths, checked on the probe's records
(tests/support/bootstrap_probe.py): tests/bootstrap/test_processes.py and
tests/test_multi_node.py assert it in every vLLM process they start."""

from __future__ import annotations

import os

from support.bootstrap_probe import (
    SONAME,
    lib_dir,
    other_vendor_dir,
    our_vendor_dir,
    vllm_ascend_vendor_dir,
)


def crafted_entries(probe_dir) -> dict[str, list[str]]:
    """The crafted entries of each variable, in the order the bootstrap must give them.

    Operators: ours, then vllm-ascend's. Libraries: vllm-ascend's, then ours (both ship a
    `libcust_opapi.so`, which vllm-ascend's extension finds by soname; ours is opened by path).
    """
    ours, theirs, other = (
        our_vendor_dir(probe_dir),
        vllm_ascend_vendor_dir(probe_dir),
        other_vendor_dir(probe_dir),
    )
    return {
        "ASCEND_CUSTOM_OPP_PATH": [str(path) for path in (ours, theirs, other)],
        "LD_LIBRARY_PATH": [str(lib_dir(path)) for path in (theirs, ours, other)],
    }


def order_of(value: str | None, known: list[str]) -> list[str]:
    """The `known` entries of a search path, in the path's order (others, e.g. cv2's, left out)."""
    return [entry for entry in (value or "").split(":") if entry in known]


def assert_ordered(record: dict, probe_dir, moments: tuple[str, ...]) -> None:
    """The bootstrap's order (`crafted_entries`) at each of the record's `moments`.

    ASCEND_CUSTOM_OPP_PATH must start with them; in LD_LIBRARY_PATH other packages may prepend
    their own directories at any time (opencv does), so there only the relative order counts.
    """
    where = f"pid {record['pid']} ({record['process_name']}: {record['title'][:60]})"
    assert record["platform_resolved_at_load"], f"{where}: general plugins before the platform"
    crafted = crafted_entries(probe_dir)
    for moment in moments:
        paths = record if moment == "final" else record[moment]
        for name, known in crafted.items():
            assert order_of(paths[name], known) == known, f"{where}, {moment}, {name}"
        opp_path = paths["ASCEND_CUSTOM_OPP_PATH"].split(":")
        assert opp_path[:2] == crafted["ASCEND_CUSTOM_OPP_PATH"][:2], f"{where}, {moment}"
        assert all(os.path.isabs(entry) for entry in opp_path), f"{where}, {moment}: {opp_path}"


def assert_inherited_in_order(record: dict, probe_dir) -> None:
    """A child's inherited LD_LIBRARY_PATH (its loader's) in the bootstrap's order.

    Packages imported after `register()` may prepend again before vLLM spawns a child (opencv
    does, in vLLM 0.23's API server), so foreign entries can come first. What the loader needs is
    that no entry ahead of vllm-ascend's directory provides `libcust_opapi.so`, the soname
    vllm-ascend's extension binds to (module docstring of vllm_npu_ext.bootstrap).
    """
    value = record["inherited"]["LD_LIBRARY_PATH"]
    inherited = [entry for entry in value.split(":") if entry]
    known = crafted_entries(probe_dir)["LD_LIBRARY_PATH"]
    where = f"pid {record['pid']} inherited {inherited}"
    assert order_of(value, known) == known, where
    ahead = inherited[: inherited.index(known[0])]
    shadowing = [entry for entry in ahead if os.path.exists(os.path.join(entry, SONAME))]
    assert not shadowing, f"{where}: {shadowing} ahead of vllm-ascend's {SONAME}"
