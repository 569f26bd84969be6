"""The cluster view's store calls that may block (an API server that does not answer) stay off the event loop.

A topic-admin request runs its metadata reads and writes in a worker thread (ClusterView.admin), and
producer ids are claimed a block ahead in the background (next_producer_id): the loop keeps serving
produce, fetch and replication meanwhile. Real SQLite store; its writes are slowed on purpose.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from sluice.broker.cluster import PID_BLOCK_SIZE, ClusterView
from sluice.broker.config import BrokerConfig
from sluice.metadata import open_store
from sluice.metadata.store import MetadataStore

SLOW_S = 0.5


class SlowWrites:
    """``store`` whose compare-and-set takes SLOW_S (as a write to a struggling API server), counted per thread."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.write_threads: list[str] = []

    def compare_and_set(self, *args: Any, **kwargs: Any) -> Any:
        self.write_threads.append(threading.current_thread().name)
        time.sleep(SLOW_S)
        return self.store.compare_and_set(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def view(tmp_path: Path) -> tuple[ClusterView, SlowWrites]:
    path = str(tmp_path / "metadata.sqlite")
    store = SlowWrites(open_store(path))
    config = BrokerConfig.build(0, "127.0.0.1", 1, str(tmp_path), path, {})
    cluster = ClusterView(store, config)  # type: ignore[arg-type]
    cluster.register()
    cluster.refresh()
    store.write_threads.clear()
    return cluster, store


async def ticks_during(work: Any) -> tuple[Any, int]:
    """Run ``work`` while a task ticks every 10 ms on the loop; (its result, the ticks counted meanwhile)."""
    count = 0
    done = asyncio.Event()

    async def tick() -> None:
        nonlocal count
        while not done.is_set():
            count += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    try:
        return await work, count
    finally:
        done.set()
        await ticker


def test_topic_admin_writes_leave_the_loop_serving(tmp_path: Path) -> None:
    cluster, store = view(tmp_path)
    heard: list[str] = []
    cluster.listeners.append(lambda old, new: heard.append(threading.current_thread().name))

    async def main() -> None:
        topic_id, ticks = await ticks_during(cluster.admin(cluster.create_topic, "orders", 2, 1, {}))
        assert ticks >= 10, f"the loop ticked {ticks} times in a {SLOW_S} s write: it was blocked"
        assert topic_id and cluster.topics["orders"].topic_id == topic_id  # applied to the view at once
        assert store.write_threads and threading.main_thread().name not in store.write_threads
        # the view's listeners (the replica manager) hear of the change on the loop's thread only
        assert heard and set(heard) == {threading.main_thread().name}

    asyncio.run(main())


def test_producer_id_blocks_are_claimed_ahead_off_the_loop(tmp_path: Path) -> None:
    cluster, store = view(tmp_path)

    async def main() -> None:
        first = cluster.next_producer_id()  # the very first block: claimed there and then
        ids = [first]
        for _ in range(PID_BLOCK_SIZE - 1):
            ids.append(cluster.next_producer_id())
        assert store.write_threads[0] == threading.main_thread().name
        await asyncio.sleep(SLOW_S * 3)  # the prefetch started at 90% has finished by now
        started = time.monotonic()
        ids.append(cluster.next_producer_id())  # the first id of the next block: no store call
        assert time.monotonic() - started < SLOW_S / 2
        assert len(store.write_threads) == 2 and store.write_threads[1] != threading.main_thread().name
        assert ids == list(range(first, first + PID_BLOCK_SIZE + 1))

    asyncio.run(main())
