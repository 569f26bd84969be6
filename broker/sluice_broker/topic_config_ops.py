"""Kafka's incremental config operations on a topic's overrides (IncrementalAlterConfigs), as a pure function.

A topic's overrides are the ``config`` of its ``topics/<name>`` document; a key
without one takes the broker's value. :func:`apply_changes` computes the
overrides a list of changes leads to, or refuses the whole list (all or
nothing per resource, as Kafka); the cluster view
(:meth:`sluice.broker.cluster.ClusterView.alter_topic_config`) reads the
document, calls it and writes the result with a compare-and-set on the
document's version. No I/O here, so every rule is unit-tested directly.

The operations (Kafka's ``AlterConfigOp.OpType``):

* SET (0): the key's override becomes the value. A null value is refused
  (INVALID_CONFIG): DELETE is how an override is removed.
* DELETE (1): the override is removed, so the broker's value applies again
  (the value sent is ignored; deleting a key without an override changes
  nothing).
* APPEND (2) / SUBTRACT (3): only for list keys (:data:`LIST_TOPIC_KEYS`,
  Kafka's type LIST: ``cleanup.policy``); on any other key INVALID_CONFIG, as
  Kafka answers. The value is a comma-separated list; APPEND adds the items not
  yet in the list in force (the override, else the broker's value: what the
  topic actually uses), SUBTRACT removes them; the result is stored as an
  override even when it equals the broker's value, as Kafka does.

Refusals: a key named twice in one resource, or an unknown operation,
INVALID_REQUEST (Kafka's); an unknown key, a Kafka key Sluice does not
implement (with the reason) or a value the key does not take, INVALID_CONFIG
with a message naming the key. The resulting overrides are checked as a whole
by :func:`sluice.broker.config.validate_topic_config`, the check CreateTopics
makes, so a value refused at creation is refused here too, and the result is
normalised the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from sluice import errors
from sluice.broker.config import LIST_TOPIC_KEYS, ConfigError, check_topic_key, validate_topic_config


class ConfigOp(IntEnum):
    """Kafka's AlterConfigOp.OpType ids."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True)
class ConfigChange:
    """One alteration: ``op`` is the wire id (an unknown one is refused, not trusted)."""

    key: str
    op: int
    value: str | None


def _items(text: str) -> list[str]:
    """A list value's items: comma-separated, blanks around them and empty items dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _invalid(message: str) -> errors.InvalidConfigError:
    return errors.InvalidConfigError(message)


def apply_changes(
    overrides: Mapping[str, str],
    changes: Sequence[ConfigChange],
    broker_value: Callable[[str], str],
) -> dict[str, str]:
    """The overrides after ``changes``; raises (changing nothing) if any of them is refused.

    ``broker_value(key)`` is the broker's value of a topic key as text: what the
    topic uses where it has no override, and what APPEND/SUBTRACT start from then.
    """
    seen: set[str] = set()
    for change in changes:
        if change.key in seen:
            raise errors.InvalidRequestError(f"config {change.key!r} is named more than once for one resource")
        seen.add(change.key)
    result = dict(overrides)
    for change in changes:
        key = change.key
        try:
            op = ConfigOp(change.op)
        except ValueError:
            raise errors.InvalidRequestError(
                f"unknown config operation {change.op} for {key!r} (SET 0, DELETE 1, APPEND 2, SUBTRACT 3)"
            ) from None
        try:
            check_topic_key(key)
        except ConfigError as exc:
            raise _invalid(str(exc)) from None
        if op is ConfigOp.DELETE:
            result.pop(key, None)
            continue
        if op is ConfigOp.SET:
            if change.value is None:
                raise _invalid(f"SET of topic config {key!r} needs a value (DELETE removes the override)")
            result[key] = change.value
            continue
        if key not in LIST_TOPIC_KEYS:
            lists = ", ".join(sorted(LIST_TOPIC_KEYS))
            raise _invalid(f"cannot {op.name} topic config {key!r}: it is not a list (list keys: {lists})")
        current = _items(result[key] if key in result else broker_value(key))
        given = _items(change.value or "")
        if op is ConfigOp.APPEND:
            current += [item for item in dict.fromkeys(given) if item not in current]
        else:
            current = [item for item in current if item not in given]
        result[key] = ",".join(current)
    try:
        return validate_topic_config(result)
    except ConfigError as exc:
        raise _invalid(str(exc)) from None
