"""Start-up, clean-up and the liveness probe of the operator.

At start-up Kopf's own settings are set (finalizer, annotation storage,
peering, posting level, workers, no cluster-wide scanning), the :class:`~sluice.operator.settings.OperatorSettings`
and the :class:`~sluice.operator.handlers.runtime.OperatorRuntime` made from
them go into Kopf's ``memo`` (which Kopf hands to every handler), and the
controller's threads start (and a reassignment throttle left by a rebalance that is gone is
removed: :func:`sluice.operator.handlers.rebalance.sweep_throttle`). Clean-up stops them. The probe (on the liveness
endpoint) says whether the controller runs and leads.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import kopf

from sluice.operator.handlers.rebalance import sweep_throttle
from sluice.operator.handlers.runtime import FINALIZER, OperatorRuntime, runtime_of
from sluice.operator.settings import OperatorSettings

log = logging.getLogger("sluice.operator")


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register start-up (with ``settings``), clean-up and the controller probe."""
    operator_settings = settings

    def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure_kopf(settings, operator_settings)
        memo.settings = operator_settings
        memo.runtime = OperatorRuntime.open(operator_settings)
        try:  # a rebalance deleted while no operator ran leaves its throttle behind: take it away
            if sweep_throttle(memo.runtime):
                log.info("removed the reassignment throttle of a rebalance that is gone or no longer running")
        except Exception as exc:  # the rebalances' rounds sweep too: never fail the start-up on it
            log.warning("reassignment throttle sweep at start-up: %s", exc)

    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.probe(id="controller", registry=registry)(probe_controller)


def configure_kopf(kopf_settings: kopf.OperatorSettings, settings: OperatorSettings) -> None:
    kopf_settings.persistence.finalizer = FINALIZER
    # One namespace, named exactly (--namespace), and CRDs that the chart installs before the
    # operator starts: nothing to discover. Kopf's scanning would list and watch namespaces and
    # CRDs cluster-wide; the chart does not grant namespaces (least privilege), and Kopf then
    # retried the 403 for about a minute before any handler ran.
    kopf_settings.scanning.disabled = True
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="sluice.dev")
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="sluice.dev")
    kopf_settings.peering.name = settings.peering_name
    kopf_settings.peering.priority = settings.peering_priority or random.randint(1, 2**31 - 1)
    kopf_settings.posting.level = logging.WARNING  # our own Events say what happened; Kopf's only for failures
    kopf_settings.execution.max_workers = 8


def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime = getattr(memo, "runtime", None)
    if isinstance(runtime, OperatorRuntime):
        runtime.close()


def probe_controller(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    try:
        controller = runtime_of(memo).controller
    except kopf.TemporaryError:
        controller = None
    if controller is None:
        return {"running": False}
    return {"running": True, "leading": controller.leading.is_set(), "epoch": controller.loop.epoch}
