"""Prometheus metrics of one broker (imported as ``sluice.broker.metrics``).

``events``      plain counters of what must be counted as it happens (bytes in/out, requests and
                their latency, ISR changes, finished transactions ...), reported by the request paths
``collectors``  prometheus_client custom collectors that read the broker's state at scrape time
                (partition counts and offsets, coordinators, consumer lag, storage) and the events
``lag``         end offsets for consumer lag, from other leaders, fetched before each scrape
``http``        GET /metrics on the broker's asyncio loop
``exporter``    :class:`~sluice.broker.metrics.exporter.BrokerMetrics`: the registry and a scrape

This package's ``__init__`` imports nothing: the replica manager imports ``events`` from here,
and ``collectors`` imports the replica manager.
"""
