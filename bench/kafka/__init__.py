"""Apache Kafka, run on this machine beside Sluice, with the parameters of Sluice's benchmark set.

* :mod:`bench.kafka.fetch` resolves Kafka's broker, tools and client jars from Maven Central with
  Maven (``pom.xml`` here) into a cache directory outside the repository.
* :mod:`bench.kafka.cluster` starts 1 or 3 KRaft nodes (combined broker and controller) on
  loopback with fresh storage, and stops, kills or restarts them by pid.
* :mod:`bench.kafka.perf` runs Kafka's own ``ProducerPerformance`` and ``ConsumerPerformance`` with
  the settings ``sluice.cli.engines.bench`` uses (3 partitions, idempotent, acks=all, linger 5 ms,
  batch 256 KiB, no compression, the same 64 record values) and turns their output into the same
  ``BenchResult`` records Sluice's bench produces, in the same units (MB = 10^6 bytes).

Kafka's side uses Kafka's own tools (JVM clients) on purpose: the comparison is "each system with
its own client", which is what a user of either gets.
"""
