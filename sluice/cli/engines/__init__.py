"""The engines of ``sluice dev``, ``sluice bench`` and ``sluice demo``: the work behind the commands.

* :mod:`~sluice.cli.engines.dev_cluster`: the background dev cluster (a detached supervisor
  process that owns a LocalCluster, and its state file);
* :mod:`~sluice.cli.engines.bench`: the benchmarks and their result files, also run by
  ``bench/run_all.py``;
* :mod:`~sluice.cli.engines.demo`: the exactly-once demo and its verification;
* :mod:`~sluice.cli.engines.progress`: the one-line progress display on stderr.

They live with the CLI, not in :mod:`sluice.testing`: they are what the commands do, not what
users' tests import. They build on :class:`sluice.testing.LocalCluster` and the client, and are
imported only when their command runs.
"""
