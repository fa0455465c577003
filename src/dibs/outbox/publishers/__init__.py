"""Publishers: one small interface, one module per broker, chosen by the URL's scheme.

========================  =============================================================
``redis://``, ``rediss://``  Redis Streams (``dibs-sql[redis]``)
``nats://``, ``tls://``      NATS JetStream (``dibs-sql[nats]``)
``amqp://``, ``amqps://``    RabbitMQ (``dibs-sql[rabbitmq]``)
``http://``, ``https://``    an HTTP webhook, one POST per event (``dibs-sql[webhook]``)
``log://``, ``stdout://``    Python logging, or JSON lines on standard output
========================  =============================================================
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from dibs._errors import InvalidArgument
from dibs.outbox.publishers.base import BrokerUnavailable, Publisher, envelope

__all__ = ["BrokerUnavailable", "Publisher", "envelope", "publisher_for"]


def _redis(url: str) -> Publisher:
    from dibs.outbox.publishers.redis import RedisStreams

    return RedisStreams(url)


def _nats(url: str) -> Publisher:
    from dibs.outbox.publishers.nats import NatsJetStream

    return NatsJetStream(url)


def _rabbitmq(url: str) -> Publisher:
    from dibs.outbox.publishers.rabbitmq import RabbitMQ

    return RabbitMQ(url)


def _webhook(url: str) -> Publisher:
    from dibs.outbox.publishers.webhook import Webhook

    return Webhook(url)


def _log(url: str) -> Publisher:
    from dibs.outbox.publishers.log import LogPublisher

    return LogPublisher(url)


def _stdout(url: str) -> Publisher:
    from dibs.outbox.publishers.log import StdoutPublisher

    return StdoutPublisher(url)


_BY_SCHEME: dict[str, Callable[[str], Publisher]] = {
    "redis": _redis,
    "rediss": _redis,
    "nats": _nats,
    "tls": _nats,
    "amqp": _rabbitmq,
    "amqps": _rabbitmq,
    "http": _webhook,
    "https": _webhook,
    "log": _log,
    "stdout": _stdout,
}


def publisher_for(url: str) -> Publisher:
    """The publisher a URL names; InvalidArgument saying what is supported for anything else."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidArgument(
            f"a publisher is named by a URL such as redis://localhost:6379/0, got {url!r}; "
            f"supported schemes: {', '.join(s + '://' for s in _BY_SCHEME)}"
        )
    scheme = urlsplit(url).scheme.lower()
    if scheme == "kafka":
        raise InvalidArgument(
            "Kafka is not supported yet: dibs ships only publishers it tests against a real broker, and none "
            "could run on its test machines; relay to one of: " + ", ".join(s + "://" for s in _BY_SCHEME)
        )
    make = _BY_SCHEME.get(scheme)
    if make is None:
        raise InvalidArgument(
            f"no publisher for {scheme}:// URLs; supported schemes: {', '.join(s + '://' for s in _BY_SCHEME)}"
        )
    return make(url)
