"""Benchmark harness (scripts and the modules they share); not part of the installed package.

The scripts (``run_all.py``, ``compare_kafka.py``, ``scale.py``, ...) are run as files; the modules
beside them (``sysstat``, ``verdict``, ``sidebyside``, ``kafka/``) are imported as ``bench.X`` with
the repository root on ``sys.path``, which the scripts arrange and pytest's rootdir gives the tests.
"""
