"""The command-line tools against the embedded NSQ's youzan mode: pub by key and partition,
tail of one partition or of an ordered topic, with youzan's fields in --json."""

from __future__ import annotations

import json

import pytest

from nsqclient.lookupd._partitions import key_partition
from nsqclient.testing import EmbeddedNSQ

PARTITION_SHIFT = 50


@pytest.fixture
def cluster():
    with EmbeddedNSQ(youzan=True, nsqd_count=2) as c:
        yield c


def test_pub_with_a_key_then_tail_one_partition(cluster, cli):
    cluster.create_topic("cli_yz", partitions=4, replica=1, multi_part=True)
    cluster.create_channel("cli_yz", "c")
    lookupd = cluster.lookupd.http_address
    lines = b"".join(b"%d\n" % i for i in range(50))
    pub = cli.run(
        "pub", "--topic", "cli_yz", "--lookupd-http-address", lookupd, "--key", "order-7",
        input=lines,
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr
    assert b"published 50 messages" in pub.stderr
    partition = key_partition("order-7", 4)
    tail = cli.run(
        "tail", "--topic", "cli_yz", "--channel", "c", "--lookupd-http-address", lookupd,
        "--partition", str(partition), "-n", "50", "--json",
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    records = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(int(r["body"]) for r in records) == list(range(50))
    for r in records:
        assert r["partition"] == partition
        assert r["internal_id"] >> PARTITION_SHIFT == partition
        assert len(r["id"]) == 32  # youzan's 16 raw bytes, as hex


def test_pub_to_a_partition_and_tail_an_ordered_topic_in_order(cluster, cli):
    cluster.create_topic("cli_yz_ord", partitions=2, replica=1, ordered=True)
    cluster.create_channel("cli_yz_ord", "c")
    lookupd = cluster.lookupd.http_address
    lines = b"".join(b"%d\n" % i for i in range(30))
    pub = cli.run(
        "pub", "--topic", "cli_yz_ord", "--lookupd-http-address", lookupd, "--partition", "1",
        "--batch-size", "1", input=lines,
    )  # fmt: skip
    assert pub.returncode == 0, pub.stderr
    tail = cli.run(
        "tail", "--topic", "cli_yz_ord", "--channel", "c", "--lookupd-http-address", lookupd,
        "--ordered", "-n", "30", "--json",
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    records = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [int(r["body"]) for r in records] == list(range(30))
    offsets = [r["offset"] for r in records]
    assert offsets == sorted(offsets) and all(r["partition"] == 1 for r in records)


def test_tail_of_an_ordered_topic_without_ordered_says_so(cluster, cli):
    cluster.create_topic("cli_yz_must", partitions=1, replica=1, ordered=True)
    cluster.create_channel("cli_yz_must", "c")
    tail = cli.run(
        "tail", "--topic", "cli_yz_must", "--lookupd-http-address", cluster.lookupd.http_address,
        "-n", "1",
    )  # fmt: skip
    assert tail.returncode == 1
    assert b"ordered=True" in tail.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--key", "k", "--partition", "1", "--lookupd-http-address", "h:1"], b"not both"),
        (["--key", "k", "--nsqd-tcp-address", "127.0.0.1:4150"], b"--key needs"),
        ([], b"--lookupd-http-address required"),
    ],
)
def test_pub_youzan_flag_misuse_is_a_usage_error(cli, flags, message):
    pub = cli.run("pub", "--topic", "t", *flags, input=b"x\n")
    assert pub.returncode == 2
    assert message in pub.stderr
