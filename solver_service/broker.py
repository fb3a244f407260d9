"""The Redis broker transport of the solver service, with one fix: a worker that loses Redis
while it holds unacknowledged messages reconnects instead of exiting.

With ``acks_late`` a worker holds its plan requests unacknowledged while it solves them (and
while retries wait for their countdown). Celery 5.7 tears a lost broker connection down in two
steps, ``collect()`` and then ``close()``; the second closes the channel, whose QoS then tries
to give the unacknowledged messages back to Redis through a transport the first step already
detached, and kombu raises ``AttributeError: 'NoneType' object has no attribute 'hostname'``,
which the worker treats as unrecoverable: it exits, and planning stops for good (found by the
chaos run, bench/chaos). Giving messages back to a broker that just went away cannot work
anyway: Redis keeps them in its unacked set and hands them out again after the visibility
timeout, and a Redis that restarted empty has lost them (the round driver asks for a plan every
round). So :class:`QoS` skips that restore when its transport is detached, and does the normal
restore otherwise (a warm shutdown).
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis

log = logging.getLogger(__name__)

TRANSPORT = "solver_service.broker:Transport"
"""The ``broker_transport`` setting that selects this transport (for redis:// URLs)."""


class QoS(redis.QoS):
    def restore_unacked_once(self, stderr: Any = None) -> Any:
        if self.channel.connection.client is None:
            log.warning(
                "broker connection lost with %s unacknowledged message(s): Redis gives them "
                "back after the visibility timeout",
                len(self._delivered),
            )
            return None
        return super().restore_unacked_once(stderr)  # type: ignore[no-untyped-call]


class Channel(redis.Channel):
    QoS = QoS


class Transport(redis.Transport):
    Channel = Channel
