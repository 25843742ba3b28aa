"""A legacy pynsq consumer, unchanged but for its first import.

It was written for pynsq (``import nsq``); with ``import nsqclient as nsq`` it runs on nsqclient's
threads, without tornado.  Stop it with Ctrl-C or SIGTERM: the Reader finishes the messages it
holds and closes before the program exits.

    python examples/pynsq_reader.py --topic clicks --channel archive \\
        --lookupd-http-address http://127.0.0.1:4161
    python examples/pynsq_reader.py --topic clicks --nsqd-tcp-address 127.0.0.1:4150
"""

import argparse
import logging

import nsqclient as nsq


def handler(message):
    # The pynsq contract: return True to finish the message, False to requeue it.
    body = message.body.decode("utf-8", "replace")
    print(f"message {message.id.decode()} attempts={message.attempts} body={body}", flush=True)
    return True


class ArchiveReader(nsq.Reader):
    def giving_up(self, message):
        print(f"giving up on {message.id.decode()} after {message.attempts} attempts", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topic", required=True)
    parser.add_argument("--channel", default="pynsq_reader")
    parser.add_argument("--nsqd-tcp-address", action="append", default=[])
    parser.add_argument("--lookupd-http-address", action="append", default=[])
    parser.add_argument("--max-in-flight", type=int, default=9)
    args = parser.parse_args()
    if not args.nsqd_tcp_address and not args.lookupd_http_address:
        parser.error("give --nsqd-tcp-address or --lookupd-http-address")

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    ArchiveReader(
        topic=args.topic,
        channel=args.channel,
        message_handler=handler,
        nsqd_tcp_addresses=args.nsqd_tcp_address,
        lookupd_http_addresses=args.lookupd_http_address,
        max_in_flight=args.max_in_flight,
        lookupd_poll_interval=15,
        heartbeat_interval=10,
    )
    print("running", flush=True)
    nsq.run()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
