"""Option mistakes a type checker must flag: each line ending in ``# error`` has one."""

from __future__ import annotations

import nsqclient

ADDRESS = "127.0.0.1:4150"

consumer = nsqclient.Consumer("clicks", "archive", None, ADDRESS, max_in_flght=100)  # error
producer = nsqclient.Producer(ADDRESS, pub_timout=5.0)  # error
wrong_owner = nsqclient.Producer(ADDRESS, max_in_flight=5)  # error
wrong_type = nsqclient.Consumer("t", "c", None, ADDRESS, msg_timeout="30")  # error
config = nsqclient.Config(heartbeat_intervall=10.0)  # error
fine = nsqclient.Consumer("t", "c", None, ADDRESS, max_in_flight=100, msg_timeout=30)
