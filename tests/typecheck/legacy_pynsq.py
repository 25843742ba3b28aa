"""A pynsq program, as pynsq's README writes it (``import nsq`` made ``import nsqclient as nsq``),
with the annotations ``mypy --strict`` asks of the program's own functions."""

from __future__ import annotations

import time
from typing import Any

import nsqclient as nsq


def handler(message: nsq.Message) -> bool:
    print(message.id, message.body, message.attempts)
    return True


def batch_handler(message: nsq.Message) -> None:
    message.enable_async()
    message.touch()
    if message.attempts > 3:
        message.requeue(backoff=False)
    else:
        message.finish()


def finish_pub(conn: Any, data: Any) -> None:
    if isinstance(data, nsq.Error):
        print("publish failed", data)


reader = nsq.Reader(
    message_handler=handler,
    lookupd_http_addresses=["http://127.0.0.1:4161"],
    topic="nsq_reader",
    channel="asdf",
    lookupd_poll_interval=15,
)
batcher = nsq.Reader(
    topic="nsq_reader",
    channel="batch",
    message_handler=batch_handler,
    nsqd_tcp_addresses=["127.0.0.1:4150"],
    max_in_flight=10,
)
writer = nsq.Writer(["127.0.0.1:4150"])


def pub_message() -> None:
    writer.pub("test", time.strftime("%H:%M:%S"), finish_pub)  # a str, as pynsq's README
    writer.pub("test", b"bytes too")
    writer.mpub("test", ["one", "two"], finish_pub)
    writer.mpub("test", [b"three", bytearray(b"four")])
    writer.dpub("test", 1000, "in a second", finish_pub)
    answer: bytes = writer.pub("test", memoryview(b"waited for")).result(timeout=5)
    print(answer)


if __name__ == "__main__":
    pub_message()
    nsq.run()
