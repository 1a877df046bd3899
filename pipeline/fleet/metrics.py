"""`/metrics` of `fleet serve`: the line for Prometheus (prometheus-client's text format).

What is counted, and from where:

* `amdflash_runs{host,status}` — runs of the signed record by host and status, exactly as
  `fleet runs` lists them (store.central.select_runs, one status rule: store.status);
* `amdflash_run_seconds{command}` — a histogram of how long ended flash (flash, resume) and
  verify runs took, start to end, from the signed record;
* `amdflash_bytes_written_total{host}` — bytes of units programmed, from the signed record;
* `amdflash_read_disagreements_total{host}` — units whose confirming reads disagreed;
* `amdflash_boards_in_progress{host}` — boards running now (live progress, advisory; a board with no
  word for `--stale-after` is not counted);
* `amdflash_push_lag_seconds{host}` — 0 when the record holds the newest checkpoint the host
  last said it had, else the seconds since the host's last push;
* `amdflash_host_last_heard_seconds{host}` — seconds since the host last pushed or said anything;
* `amdflash_central_checkpoints{host}` — the host's newest checkpoint in the record.

The record is read at most every few seconds (a scrape in between gets the same numbers).
"""
from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)
CACHE_SECONDS = 5.0


def _seconds(started: Any, ended: Any) -> float | None:
    try:
        return (dt.datetime.fromisoformat(str(ended)) - dt.datetime.fromisoformat(str(started))).total_seconds()
    except (TypeError, ValueError):
        return None


class Collector:
    """A prometheus-client collector over the line (live state) and the signed record."""

    def __init__(self, line: Any, url: str):
        self.line, self.url = line, url
        self._lock = threading.Lock()
        self._cached: tuple[float, bytes] | None = None

    def facts(self) -> dict[str, Any]:
        from amdflash.store import central

        with central.connect(self.url) as pg:
            central.need_schema(pg)
            return {"runs": central.select_runs(pg), "totals": central.line_totals(pg),
                    "hosts": central.hosts_health(pg)}

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        facts = self.facts()
        runs = GaugeMetricFamily("amdflash_runs", "Runs of the signed record, as fleet runs lists them",
                                 labels=["host", "status"])
        counts: dict[tuple[str, str], int] = {}
        durations: dict[str, list[float]] = {"flash": [], "verify": []}
        for r in facts["runs"]:
            counts[(r["host"], r["status"])] = counts.get((r["host"], r["status"]), 0) + 1
            kind = "flash" if r["command"] in ("flash", "resume") else r["command"]
            if kind in durations and r["status"] in ("succeeded", "failed", "interrupted"):
                seconds = _seconds(r["started"], r["updated"])
                if seconds is not None and seconds >= 0:
                    durations[kind].append(seconds)
        for (host, status), n in sorted(counts.items()):
            runs.add_metric([host, status], n)
        yield runs
        hist = HistogramMetricFamily("amdflash_run_seconds", "Seconds from start to end of ended flash and verify "
                                     "runs (signed record)", labels=["command"])
        for kind, values in durations.items():
            buckets = [(str(b), sum(1 for v in values if v <= b)) for b in BUCKETS] + [("+Inf", len(values))]
            hist.add_metric([kind], buckets, sum(values))
        yield hist
        written = CounterMetricFamily("amdflash_bytes_written", "Bytes of units programmed (signed record)",
                                      labels=["host"])
        for host, n in sorted(facts["totals"]["bytes_written"].items()):
            written.add_metric([host], int(n))
        yield written
        disagreements = CounterMetricFamily("amdflash_read_disagreements", "Units whose confirming reads disagreed "
                                            "(signed record)", labels=["host"])
        for host, n in sorted(facts["totals"]["read_disagreements"].items()):
            disagreements.add_metric([host], int(n))
        yield disagreements
        snap = self.line.snapshot()
        busy = GaugeMetricFamily("amdflash_boards_in_progress", "Boards running now (live progress, advisory)",
                                 labels=["host"])
        running: dict[str, int] = {h["name"]: 0 for h in facts["hosts"]}
        for b in snap.boards:
            if b.state == "running" and not b.stale:      # a leftover running row is not a board at work
                running[b.host] = running.get(b.host, 0) + 1
        for host, n in sorted(running.items()):
            busy.add_metric([host], n)
        yield busy
        lag = GaugeMetricFamily("amdflash_push_lag_seconds", "Seconds since the last push while the host holds "
                                "checkpoints the record lacks (0: up to date)", labels=["host"])
        heard = GaugeMetricFamily("amdflash_host_last_heard_seconds", "Seconds since the host last pushed or "
                                  "said anything", labels=["host"])
        checkpoints = GaugeMetricFamily("amdflash_central_checkpoints", "The host's newest checkpoint in the "
                                        "record", labels=["host"])
        now = dt.datetime.now(dt.UTC)
        for h in facts["hosts"]:
            pushed, said = h.get("pushed_at"), h.get("last_heard")
            behind = (h.get("host_checkpoint") or 0) > (h.get("checkpoint") or 0)
            lag.add_metric([h["name"]], (now - pushed).total_seconds() if behind and pushed else
                           (now - said).total_seconds() if behind and said else 0.0)
            times = [t for t in (pushed, said) if t is not None]
            if times:
                heard.add_metric([h["name"]], (now - max(times)).total_seconds())
            checkpoints.add_metric([h["name"]], h.get("checkpoint") or 0)
        yield lag
        yield heard
        yield checkpoints

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < CACHE_SECONDS:
                return self._cached[1], CONTENT_TYPE_LATEST
            registry = CollectorRegistry(auto_describe=False)
            registry.register(self)
            body = generate_latest(registry)
            self._cached = (time.monotonic(), body)
            return body, CONTENT_TYPE_LATEST
