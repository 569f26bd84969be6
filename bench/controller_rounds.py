"""The controller's rounds at scale, alone in their process: where a round's time goes.

The metadata simulation (bench/metadata_scale.py) measured the controller's rounds at 100 brokers
and 100,000 partitions (median 2.9 s, at most 20.6 s through a rolling restart), but it runs them
in one Python process with the 100 simulated brokers' watch streams, so its figures mix the
controller's cost with the simulation's. This benchmark runs the real
:class:`~sluice.operator.controller.loop.ControllerLoop` alone over the real local metadata store
(SQLite, as the embedded cluster's) with partition change records on, health answers and a clock
it controls, and times each round of a broker's failure and return, with a profile (cProfile) of
each phase:

* ``idle``: nothing changes (the memo: no topic decided);
* ``kill``: the broker is declared dead: every topic it is in is decided, its leaderships move and
  it leaves every ISR, in one partition change record;
* ``return``: it answers again and the leaders ask (``isr_requests/<leader>``) to take it back
  into their ISRs, ``--waves`` leaders' requests per round, as they see it catch up;
* ``preferred``: the preferred-leader delay passes and its leaderships come back;
* ``fold``: the records are folded into ``topic_states/`` (one fold of everything written, spread
  over rounds: ``FOLD_TOPICS_PER_ROUND`` topics each).

Run ``python bench/controller_rounds.py`` (defaults: 100 brokers, 100 topics x 1,000 partitions,
RF 3; ``--profile`` adds a cProfile of each phase, which about doubles the times); results go to
``bench/results/controller-rounds.{json,md}`` (``--stem``). Every loop is bounded in rounds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # import bench.* and sluice.* from the repository root

from sluice.metadata import documents, keys, open_store  # noqa: E402
from sluice.metadata.documents import (  # noqa: E402
    METADATA_PARTITION_CHANGES,
    BrokerDocument,
    IsrRequest,
    IsrRequestsDocument,
)
from sluice.metadata.store import MetadataStore  # noqa: E402
from sluice.operator.controller.decisions import new_topic  # noqa: E402
from sluice.operator.controller.loop import ControllerLoop  # noqa: E402
from sluice.operator.liveness.brokers import FailureDetector  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TIMEOUT_S = 9.0  # the operator's session timeout
PREFERRED_DELAY_S = 10.0
MAX_ROUNDS = 200  # per phase


class Health:
    """Health answers and a clock the benchmark controls."""

    def __init__(self) -> None:
        self.now = 0.0
        self.down: set[int] = set()

    def clock(self) -> float:
        return self.now

    def check(self, targets: Mapping[int, str]) -> dict[int, str]:
        return {b: "UNAVAILABLE" if b in self.down else "SERVING" for b in targets}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def build(store: MetadataStore, brokers: int, topics: int, partitions: int, rf: int) -> None:
    for b in range(brokers):
        doc = BrokerDocument(b, "127.0.0.1", 9000 + b, metadata_features=(METADATA_PARTITION_CHANGES,))
        store.compare_and_set(keys.broker(b), doc.to_json(), None)
    placement = [(b, "") for b in range(brokers)]
    for t in range(topics):
        doc = new_topic(f"topic-{t}", f"id-{t}", partitions, rf, {}, placement)
        store.compare_and_set(keys.topic(doc.name), doc.to_json(), None)


def readmit_requests(controller: ControllerLoop, broker: int) -> dict[int, list[IsrRequest]]:
    """Per leader, the requests to take ``broker`` back into the ISRs it is missing from."""
    by_leader: dict[int, list[IsrRequest]] = {}
    for name, topic in controller.topics.view.topics().items():
        for i, p in enumerate(topic.partitions):
            if broker in p.replicas and broker not in p.isr and p.leader >= 0:
                request = IsrRequest(
                    name, topic.topic_id, i, p.leader_epoch, p.partition_epoch, list(p.isr), [*p.isr, broker]
                )
                by_leader.setdefault(p.leader, []).append(request)
    return by_leader


class Phases:
    """Times each round and profiles each phase."""

    def __init__(self, controller: ControllerLoop, top: int, profile: bool) -> None:
        self.controller = controller
        self.top = top
        self.profile = profile  # cProfile about doubles a round's time: timings are taken without it
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, name: str, rounds: Callable[[], bool]) -> None:
        """Rounds of ``name`` while ``rounds()`` says to go on (it runs one round and returns whether to go on)."""
        profile = cProfile.Profile()
        times: list[float] = []
        written = 0
        original = self.controller.run_round

        def timed() -> int:
            nonlocal written
            started = time.perf_counter()
            if self.profile:
                profile.enable()
            try:
                n = original()
            finally:
                if self.profile:
                    profile.disable()
            times.append(time.perf_counter() - started)
            written += n
            return n

        self.controller.run_round = timed  # type: ignore[method-assign]
        try:
            for _ in range(MAX_ROUNDS):
                if not rounds():
                    break
        finally:
            self.controller.run_round = original  # type: ignore[method-assign]
        out = io.StringIO()
        if self.profile:
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(self.top)
        summary = {
            "rounds": len(times),
            "topics_written": written,
            "median_ms": round(statistics.median(times) * 1000, 1) if times else None,
            "max_ms": round(max(times) * 1000, 1) if times else None,
            "total_ms": round(sum(times) * 1000, 1),
            "profile": out.getvalue(),
        }
        self.results[name] = summary
        log(
            f"{name}: {len(times)} round(s), {written} topic(s) written, median {summary['median_ms']} ms, "
            f"max {summary['max_ms']} ms"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", type=int, default=100)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--rf", type=int, default=3)
    parser.add_argument("--waves", type=int, default=5, help="leaders whose ISR requests land per round")
    parser.add_argument("--profile", action="store_true", help="profile each phase (cProfile; slows rounds down)")
    parser.add_argument("--top", type=int, default=15, help="profile lines per phase")
    parser.add_argument("--stem", default="controller-rounds")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="sluice-controller-rounds-") as tmp:
        store = open_store(str(Path(tmp) / "metadata.sqlite"))
        log(f"building {args.topics} topics x {args.partitions} partitions over {args.brokers} brokers")
        build(store, args.brokers, args.topics, args.partitions, args.rf)
        health = Health()
        detector = FailureDetector(health.check, timeout_ms=int(TIMEOUT_S * 1000), clock=health.clock)
        controller = ControllerLoop(store, detector, preferred_leader_delay_ms=int(PREFERRED_DELAY_S * 1000))
        controller.claim()
        phases = Phases(controller, args.top, args.profile)
        started = time.perf_counter()
        for _ in range(3):  # the first rounds: every broker unknown, then alive; the switch to records
            health.now += 1
            controller.run_round()
        log(f"first rounds (the switch to records): {time.perf_counter() - started:.1f} s")
        health.now += PREFERRED_DELAY_S

        idle = iter(range(20))
        phases.run("idle", lambda: next(idle, None) is not None and controller.run_round() >= 0)

        victim = 1
        health.down = {victim}
        health.now += TIMEOUT_S + 0.1
        phases.run("kill", lambda: controller.run_round() > 0 or victim not in controller.dead)

        health.down = set()
        health.now += 0.5
        controller.run_round()  # it answers: alive again
        pending = readmit_requests(controller, victim)
        leaders = sorted(pending)
        log(f"return: {sum(map(len, pending.values()))} ISR requests from {len(leaders)} leaders")

        def wave() -> bool:
            for leader in leaders[: args.waves]:
                doc = IsrRequestsDocument(leader, pending[leader], int(health.now * 1000))
                documents.update_document(store, keys.isr_requests(leader), IsrRequestsDocument, lambda _, d=doc: d)
            del leaders[: args.waves]
            health.now += 0.2
            return controller.run_round() > 0 or bool(leaders)

        phases.run("return", wave)
        health.now += PREFERRED_DELAY_S
        phases.run("preferred", lambda: controller.run_round() > 0)
        idle = iter(range(20))
        phases.run("idle after", lambda: next(idle, None) is not None and controller.run_round() >= 0)

        controller.fold_records = 1
        phases.run("fold", lambda: bool(controller.topics.view.records) and controller.run_round() >= 0)
        store.close()

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "phases": phases.results}
    (RESULTS / f"{args.stem}.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        f"# The controller's rounds alone ({args.brokers} brokers, {args.topics} x {args.partitions} partitions, "
        f"RF {args.rf})",
        "",
        f"`python bench/controller_rounds.py{' --profile' if args.profile else ''}` at {out['when']}; SQLite store, "
        "records on; times " + ("under cProfile (about twice as long)" if args.profile else "without a profiler") + ".",
        "",
        "| phase | rounds | topics written | median ms | max ms | total ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in phases.results.items():
        row = f"| {name} | {r['rounds']} | {r['topics_written']} | {r['median_ms']} | {r['max_ms']} | {r['total_ms']} |"
        lines.append(row)
    for name, r in phases.results.items():
        if r["profile"]:
            lines += ["", f"## {name}: top of the profile (tottime)", "", "```", r["profile"].strip(), "```"]
    (RESULTS / f"{args.stem}.md").write_text("\n".join(lines) + "\n")
    log(f"results: {RESULTS / args.stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
