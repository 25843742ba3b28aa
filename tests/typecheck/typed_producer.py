"""A typed program publishing with nsqclient's own Producer."""

from __future__ import annotations

from concurrent.futures import Future

import nsqclient
from nsqclient.config import ProducerOptions

OPTIONS: ProducerOptions = {"pub_timeout": 2.5, "dial_timeout": 1, "snappy": False}


def publish(producer: nsqclient.Producer) -> list[bytes | nsqclient.PublishResult]:
    producer.pub("clicks", b"bytes")
    producer.pub("clicks", "a str, sent as UTF-8")
    producer.pub("clicks", bytearray(b"a bytearray"), timeout=1.0)
    producer.mpub("clicks", [b"a", "b", memoryview(b"c")])
    producer.dpub("clicks", b"later", delay=1.5)
    futures: list[Future[bytes | nsqclient.PublishResult]] = [
        producer.pub_async("clicks", b"x"),
        producer.mpub_async("clicks", [b"y", b"z"]),
    ]
    delayed: Future[bytes] = producer.dpub_async("clicks", "later", delay=0.5)
    ok: bytes = delayed.result(timeout=5)
    print(ok)
    return [future.result(timeout=5) for future in futures]


def traced(producer: nsqclient.Producer) -> int:
    result = producer.pub("orders", b"x", trace_id=7)  # a PublishResult: traced
    batch = producer.mpub("orders", [b"x", b"y"], trace_id=[1, 2])
    answer = producer.pub_async("orders", b"z", trace_id=8).result(timeout=5)
    maybe = producer.pub("orders", b"w")  # None unless the Producer traces every publish
    if maybe is not None:
        print(maybe.message_id)
    return result.offset + batch.raw_size + answer.partition if answer.partition else 0


def report(error: nsqclient.UndeliveredError) -> None:
    for future in error.futures:
        print(future.exception(timeout=0))
    print(error.count, error.failed, error.unanswered)


def main() -> None:
    config = nsqclient.Config(pub_timeout=3.0, max_in_flight=5)
    print(config.pub_timeout, config.replace(dial_timeout=0.5).dial_timeout)
    with nsqclient.Producer(["127.0.0.1:4150"], **OPTIONS) as producer:
        try:
            publish(producer)
            producer.flush(timeout=5)
        except nsqclient.UndeliveredError as error:
            report(error)
    lookup = nsqclient.Producer(
        lookupd_http_addresses="http://127.0.0.1:4161", trace=True, leader_retries=3
    )
    print(traced(lookup))
    lookup.close()


if __name__ == "__main__":
    main()
