"""A few seeds of every partition-soak mode on every change (issue 30).

Each mode of :mod:`tests.integration.partition_soak` runs ``SLUICE_SOAK_SEEDS`` seeds (default 1)
from ``SLUICE_SOAK_FIRST_SEED`` (default 1) with the soak's short timing (faults held 10-12 s,
``mixed`` two faults): three impatient transactional workers under iptables partitions, kill -9
and no fault at all; the queue checker and the replica consistency check must find nothing. The
many-seed runs are the soak command's (``python -m tests.integration.partition_soak --mode all
--seeds 50``, docs/faults.md). A failing run's directory (broker logs, RocksDB data, ``run.json``
with its events and every transaction's outcome) is kept under the test's tmp_path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from . import partition_soak

SEEDS = int(os.environ.get("SLUICE_SOAK_SEEDS", "1"))
FIRST_SEED = int(os.environ.get("SLUICE_SOAK_FIRST_SEED", "1"))


@pytest.mark.parametrize("mode", partition_soak.MODES)
def test_partition_soak(tmp_path: Path, mode: str) -> None:
    for seed in range(FIRST_SEED, FIRST_SEED + SEEDS):
        result = partition_soak.run_one(mode, seed, tmp_path, partition_soak.SHORT)
        print(f"\n{result.line()}")
        assert result.committed > 0, result.line()
        assert not result.failed, (
            f"{result.line()}\nanomalies: {json.dumps(result.anomalies, indent=1)[:4000]}\n"
            f"events: {result.events}\n{result.error}"
        )
