#!/usr/bin/env python3
"""What TLS costs: the standard set in plaintext and in secure mode, alternating, side by side.

    python bench/tls_cost.py                     # 8 pairs of run_all.py --repeat 1: plaintext, --secure, ...
    python bench/tls_cost.py --pairs 3 --quick   # a smoke run (~3 min)
    python bench/tls_cost.py --report-since 2026-11-26T23:19:00   # rebuild the report from recorded runs

Secure mode is `run_all.py --secure`: mutual TLS between the client and the broker, and the
authorizer on (the benchmark connects as the super user). Each run is a fresh single-broker
LocalCluster, and the two modes alternate, so a machine that speeds up or slows down during the
call weighs on both alike. On a small shared machine single runs spread by +-25%, more than the
effect measured, which is why the report is of medians over many pairs, with every run shown.

Runs are recorded by run_all.py itself in bench/results/results.json (``params.secure``); the
report takes every standard-set, one-broker run started since this call began (or since
``--report-since``) and writes bench/results/tls-cost.json, tls-cost.md and, with matplotlib
(pip install -e '.[bench]'), tls-cost.png: each run as a dot, the medians, and the ratio
secure/plaintext of the medians (for the latency benchmark, of the p99).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODES = ("plaintext", "secure")


def figure(run: dict[str, Any]) -> float:
    """A run's headline: p99 ms for the latency benchmark, else MB/s."""
    return float(run["latency_ms"]["p99"]) if run.get("latency_ms") else float(run["mb_per_s"])


def collect(results: Path, since: datetime.datetime, quick: bool) -> dict[str, dict[str, list[float]]]:
    """benchmark -> mode -> figures, in the order the runs started."""
    wanted_set = "quick" if quick else "standard"
    out: dict[str, dict[str, list[float]]] = {}
    runs = json.loads(results.read_text()) if results.exists() else []
    for run in sorted(runs, key=lambda r: r.get("started_at", "")):
        params = run.get("params", {})
        started = datetime.datetime.fromisoformat(run.get("started_at", "1970-01-01T00:00:00+00:00"))
        if started < since or params.get("set") != wanted_set or params.get("brokers") != 1 or run.get("error"):
            continue
        mode = "secure" if params.get("secure") else "plaintext"
        out.setdefault(run["name"], {m: [] for m in MODES})[mode].append(round(figure(run), 2))
    return out


def summarize(data: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    rows = []
    for name, by_mode in data.items():
        plain, secure = by_mode["plaintext"], by_mode["secure"]
        if not plain or not secure:
            continue
        mp, ms = statistics.median(plain), statistics.median(secure)
        rows.append({
            "benchmark": name, "unit": "p99 ms" if name.startswith("latency") else "MB/s",
            "plaintext": plain, "secure": secure, "plaintext_median": mp, "secure_median": ms,
            "ratio": round(ms / mp, 3) if mp else None,
        })  # fmt: skip
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| benchmark | unit | plaintext runs | secure runs | plaintext median | secure median | secure/plaintext |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['benchmark']} | {r['unit']} | {', '.join(map(str, r['plaintext']))} | "
            f"{', '.join(map(str, r['secure']))} | {r['plaintext_median']:.1f} | {r['secure_median']:.1f} | "
            f"{r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> bool:
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 4.2), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        for x, mode, color in ((0, "plaintext", "#3b7dd8"), (1, "secure", "#d8823b")):
            ys = r[mode]
            ax.scatter([x] * len(ys), ys, color=color, alpha=0.6, s=18)
            ax.hlines(r[f"{mode}_median"], x - 0.25, x + 0.25, color=color, linewidth=2.5)
        ax.set_xticks([0, 1], ["plain", "TLS"])
        ax.set_xlim(-0.6, 1.6)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{r['benchmark']}\nsecure/plain {r['ratio']:.2f}", fontsize=9)
        ax.set_ylabel(r["unit"])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run_pairs(pairs: int, quick: bool, results: Path) -> None:
    for i in range(pairs):
        for mode in MODES:
            cmd = [sys.executable, str(HERE / "run_all.py"), "--repeat", "1", "--no-progress"]
            cmd += ["--results", str(results)]
            cmd += ["--secure"] if mode == "secure" else []
            cmd += ["--quick"] if quick else []
            started = time.monotonic()
            print(f"pair {i + 1}/{pairs}: {mode} ...", end=" ", flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"FAILED (exit {done.returncode})\n{done.stdout[-2000:]}{done.stderr[-2000:]}", flush=True)
                raise SystemExit(1)
            print(f"{time.monotonic() - started:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=8, help="plaintext/secure pairs of run_all.py --repeat 1 (default 8)")
    ap.add_argument("--quick", action="store_true", help="run_all.py --quick: 10x fewer records (smoke run)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="output directory (default bench/results)")
    ap.add_argument("--report-since", help="ISO time (UTC): report recorded runs since then, run nothing")
    args = ap.parse_args(argv)
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    if args.report_since:
        since = datetime.datetime.fromisoformat(args.report_since)
        since = since if since.tzinfo else since.replace(tzinfo=datetime.UTC)
    else:
        since = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        run_pairs(args.pairs, args.quick, args.results)
    rows = summarize(collect(args.results / "results.json", since, args.quick))
    if not rows:
        print(f"no plaintext and secure runs of the {'quick' if args.quick else 'standard'} set since {since}")
        return 1
    pairs = min(len(r["secure"]) for r in rows)
    title = f"TLS cost: run_all.py --repeat 1, plaintext vs --secure, {pairs} runs each"
    title += f", since {since:%Y-%m-%d %H:%M} UTC"
    md = markdown(rows, title)
    stem = "tls-cost" + ("-smoke" if args.quick else "")
    (args.results / f"{stem}.json").write_text(json.dumps({"since": since.isoformat(), "rows": rows}, indent=2) + "\n")
    (args.results / f"{stem}.md").write_text(md + "\n")
    print(md)
    if plot(rows, args.results / f"{stem}.png", title):
        print(f"\nchart: {args.results / f'{stem}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
