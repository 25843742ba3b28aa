"""A typed program consuming with nsqclient's own Consumer: a handler, and pull mode."""

from __future__ import annotations

import nsqclient
from nsqclient.config import ConsumerOptions
from nsqclient.consumer._batch import MessageBatch


def handle(message: nsqclient.Message) -> bool:
    if not message.body:
        raise nsqclient.RequeueMessage(delay=2.0, backoff=False)
    return True


def giving_up(message: nsqclient.Message) -> None:
    print("giving up on", message.id)


def pull(consumer: nsqclient.Consumer) -> int:
    consumer.start()
    messages: list[nsqclient.Message] = consumer.take(100, timeout=1.0, fill=True)
    answered = consumer.finish_many(messages)
    answered += consumer.requeue_many(consumer.take(10), delay=5.0, backoff=False)
    consumer.stop(timeout=5.0)
    return answered


def columns(consumer: nsqclient.Consumer) -> list[bytes]:
    consumer.start()
    batches: list[MessageBatch] = consumer.take_batches(1000, timeout=0.5, fill=True)
    bodies = [body for batch in batches for body in batch.bodies()]
    consumer.finish_batches(batches)
    consumer.stop()
    return bodies


def main() -> None:
    consumer = nsqclient.Consumer(
        "clicks",
        "archive",
        handle,
        lookupd_http_addresses=["http://127.0.0.1:4161"],
        giving_up=giving_up,
        concurrency=8,
        max_tries=10,
        default_requeue_delay=5,
        backoff_strategy="full_jitter",
        msg_timeout=None,
        tls_v1=False,
    )
    consumer.start()
    options: ConsumerOptions = {"max_in_flight": 100, "msg_timeout": 30.0}
    nsqclient.Consumer("clicks", "other", handle, "127.0.0.1:4150", **options).run()
    print(consumer.stats()["received"], consumer.is_starved(), consumer.max_in_flight)
    consumer.stop()
    print(pull(nsqclient.Consumer("clicks", "bulk", None, "127.0.0.1:4150", max_in_flight=200)))
    print(columns(nsqclient.Consumer("clicks", "cols", None, "127.0.0.1:4150", columnar=True)))


if __name__ == "__main__":
    main()
