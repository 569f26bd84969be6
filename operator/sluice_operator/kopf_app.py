"""The Kopf operator as a module for ``kopf run -m sluice.operator.kopf_app`` (``sluice operator`` is the same).

``kopf run -m`` can only import a module, so importing this one is the
operator's start-up: it reads the settings once from the environment
(:meth:`sluice.operator.settings.OperatorSettings.from_environment`; a bad
value stops the start with an error naming the variable) and registers every
handler of :mod:`sluice.operator.handlers` with them into Kopf's default
registry. Kopf then runs them: start-up puts the settings and the runtime
into ``memo``.

Nothing else imports this module: ``sluice operator`` (:mod:`sluice.operator.main`)
builds its settings from its flags and the environment and registers the same
handlers itself (importing this module too would register them twice).
"""

from __future__ import annotations

import kopf

from sluice.operator.handlers import register
from sluice.operator.settings import OperatorSettings

register(kopf.get_default_registry(), OperatorSettings.from_environment())
