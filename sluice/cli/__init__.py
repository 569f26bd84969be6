"""The ``sluice`` command: broker, local dev cluster, topics, produce/consume, transactions, bench, demo.

One module per command group, each with its options (``register``) and its work (``run``):

* :mod:`~sluice.cli.topics`, :mod:`~sluice.cli.produce`, :mod:`~sluice.cli.consume`,
  :mod:`~sluice.cli.transactions`: Kafka's console tools, with Kafka's option names;
* :mod:`~sluice.cli.dev`, :mod:`~sluice.cli.bench`, :mod:`~sluice.cli.demo`: a background local
  cluster, benchmarks and the exactly-once demo; their engines are in :mod:`sluice.cli.engines`;
* :mod:`~sluice.cli.passthrough`: ``sluice broker`` and ``sluice operator``, the image's two
  processes, which hand the rest of the line to their own parsers.

And the parts they share: :mod:`~sluice.cli.parser` (the argument parser),
:mod:`~sluice.cli.argtypes` (option value types), :mod:`~sluice.cli.bootstrap` (where to
connect), :mod:`~sluice.cli.clients` (the typed seam to :mod:`sluice.client`),
:mod:`~sluice.cli.output` (stdout for data, stderr for the rest) and :mod:`~sluice.cli.exits`
(failures to exit codes: 0 success, 1 failure, 2 bad usage, 130 interrupted);
:mod:`~sluice.cli.app` holds ``main``. :mod:`~sluice.cli.copier` is a program of its own
(``python -m sluice.cli.copier``), not a sub-command.

Heavy imports (the client, the broker, grpc) happen inside the commands: ``sluice --help``
stays fast and ``sluice broker`` loads only the broker. Nothing imports this package
(import-linter's top layer and a "protected" contract), except ``python -m sluice``.
"""

from sluice.cli.app import main
from sluice.cli.bootstrap import DEFAULT_BOOTSTRAP, ENV_BOOTSTRAP, resolve_bootstrap
from sluice.cli.exits import CliError
from sluice.cli.parser import build_parser

__all__ = ["DEFAULT_BOOTSTRAP", "ENV_BOOTSTRAP", "CliError", "build_parser", "main", "resolve_bootstrap"]
