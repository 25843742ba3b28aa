"""A typed asyncio program publishing without blocking its event loop."""

from __future__ import annotations

import asyncio

import nsqclient


async def publish(producer: nsqclient.Producer, body: bytes) -> bytes | nsqclient.PublishResult:
    return await nsqclient.aresult(producer.pub_async("clicks", body))


async def traced(producer: nsqclient.Producer) -> int:
    result = await nsqclient.aresult(producer.pub_async("orders", b"x", trace_id=1))
    return result.offset


async def main() -> None:
    producer = nsqclient.Producer("127.0.0.1:4150")
    answers = await asyncio.gather(*(publish(producer, b"%d" % i) for i in range(10)))
    delayed: bytes = await nsqclient.aresult(producer.dpub_async("clicks", b"x", delay=1.0))
    print(answers, delayed, await traced(producer))
    producer.close()


if __name__ == "__main__":
    asyncio.run(main())
