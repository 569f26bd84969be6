"""bench/sysstat.py: /proc parsing and process-tree CPU accounting (pure parts, plus one live check)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench import sysstat

# A real /proc/PID/stat line shape, with a command name holding a space and a parenthesis.
STAT = (
    "4242 (my (odd) proc) S 4000 4242 4000 0 -1 4194560 900 0 0 0 "
    "150 25 7 3 20 0 9 0 123456 987654321 2500 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0"
)


def test_parse_stat_counts_fields_after_the_last_parenthesis() -> None:
    s = sysstat.parse_stat(STAT)
    assert s.pid == 4242
    assert s.ppid == 4000
    assert s.cpu_ticks == 175  # utime 150 + stime 25
    assert s.child_ticks == 10  # cutime 7 + cstime 3
    assert s.rss_pages == 2500


def test_parse_machine_busy_excludes_idle_and_iowait() -> None:
    text = "cpu  100 5 50 1000 40 3 2 7 11 0\ncpu0 50 2 25 500 20 1 1 3 0 0\n"
    busy, total = sysstat.parse_machine(text)
    assert busy == 100 + 5 + 50 + 3 + 2 + 7  # guest (11) is already inside user
    assert total == busy + 1000 + 40


def test_parse_machine_without_aggregate_line_is_an_error() -> None:
    with pytest.raises(ValueError):
        sysstat.parse_machine("cpu0 1 2 3 4\n")


def test_descendants_and_tree_ticks_sum_live_members_with_reaped_children() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 21: 20}
    assert sysstat.descendants(parents, [10]) == {10, 11, 12, 13}
    assert sysstat.descendants(parents, [99]) == set()  # a root that exited contributes nothing
    stats = {p: sysstat.ProcStat(p, pp, cpu_ticks=p, child_ticks=1, rss_pages=1) for p, pp in parents.items()}
    assert sysstat.tree_ticks(stats, {10, 11, 12, 13}) == (10 + 11 + 12 + 13) + 4


def test_interpolate_between_samples_and_clamps_outside() -> None:
    pts = [(0.0, 0.0), (1.0, 10.0), (3.0, 12.0)]
    assert sysstat.interpolate(pts, 0.5) == pytest.approx(5.0)
    assert sysstat.interpolate(pts, 2.0) == pytest.approx(11.0)
    assert sysstat.interpolate(pts, -1.0) == 0.0
    assert sysstat.interpolate(pts, 9.0) == 12.0
    with pytest.raises(ValueError):
        sysstat.interpolate([], 1.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc accounting is Linux's")
def test_tree_cpu_counts_a_child_that_burns_cpu() -> None:
    """A child burning ~0.3 s of CPU shows in its parent's tree after it is reaped.

    The tree is rooted at a fresh parent process, not at pytest: pytest's own tree holds whatever
    earlier tests left running, and a grandchild that exits orphaned takes its CPU time with it.
    """
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    parent_code = (
        "import subprocess, sys\n"
        "sys.stdin.readline()\n"
        f"subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n"
        "print('done', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdin is not None and parent.stdout is not None
    try:
        before = sysstat.sample({"p": [parent.pid]}).cpu_s["p"]
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "done"
        after = sysstat.sample({"p": [parent.pid]}).cpu_s["p"]
    finally:
        parent.stdin.close()
        parent.wait(timeout=60)
    assert after - before >= 0.25
