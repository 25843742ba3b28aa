"""producer.rst's Django recipe, as printed, under Django's test client: one Producer per process,
publishing only after the transaction commits (and never after a rollback)."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

import nsqclient

django = pytest.importorskip("django", reason="Django is not installed (dev extra)")

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "docs")


def recipe_files() -> dict[str, str]:
    """The code blocks of producer.rst whose first line names a file of the ``shop`` app."""
    with open(os.path.join(DOCS, "producer.rst"), encoding="utf-8") as f:
        text = f.read()
    files = {}
    for block in re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", text):
        code = "\n".join(line[4:] for line in block.splitlines()) + "\n"
        first = code.lstrip().splitlines()[0]
        if first.startswith("# shop/"):
            files[first[2:].strip()] = code
    return files


def read_one(cluster, topic: str, channel: str) -> bytes:
    """One message of ``topic`` through a SyncConn (FIN'd)."""
    host, port = cluster.nsqd.tcp_address.rsplit(":", 1)
    conn = nsqclient.SyncConn(timeout=10.0)
    conn.connect(host, int(port))
    try:
        conn.send(nsqclient.subscribe(topic, channel))
        assert nsqclient.unpack_response(conn.read_response()) == (0, b"OK")
        conn.send(nsqclient.ready(1))
        while True:
            frame_type, data = nsqclient.unpack_response(conn.read_response())
            if frame_type == nsqclient.FRAME_TYPE_MESSAGE:
                message = nsqclient.decode_message(data)
                conn.send(nsqclient.finish(message.id))
                return message.body
            assert data == b"_heartbeat_", data
            conn.send(nsqclient.nop())
    finally:
        conn.close()


def topic_count(cluster, topic: str) -> int:
    stats = nsqclient.NsqdHTTPClient(cluster.nsqd.http_address).stats(topic=topic)
    return sum(t["message_count"] for t in stats.get("topics") or [] if t["topic_name"] == topic)


def test_django_recipe_publishes_after_commit_only(nsqd, tmp_path, monkeypatch):
    files = recipe_files()
    assert sorted(files) == ["shop/models.py", "shop/nsq.py", "shop/views.py"]
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    (tmp_path / "shop" / "urls.py").write_text(
        "from django.urls import path\n"
        "from .views import create_order\n"
        'urlpatterns = [path("orders", create_order)]\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    from django.conf import settings

    if settings.configured:
        pytest.skip("Django was configured by another test in this process")
    settings.configure(
        DEBUG=False,
        SECRET_KEY="test",
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=["django.contrib.contenttypes", "shop"],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db")}
        },
        ROOT_URLCONF="shop.urls",
        MIDDLEWARE=[],
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        NSQD_TCP_ADDRESSES=[nsqd.nsqd.tcp_address],
    )
    django.setup()
    from django.db import connection, transaction
    from django.test import Client
    from shop.models import Order
    from shop.nsq import producer

    try:
        with connection.schema_editor() as editor:
            editor.create_model(Order)
        nsqclient.NsqdHTTPClient(nsqd.nsqd.http_address).create_topic("orders")
        client = Client()

        # A request whose transaction commits: the order is published, after the commit.
        reply = client.post("/orders", {"item": "book"})
        assert reply.status_code == 201
        order = reply.json()["order"]
        assert json.loads(read_one(nsqd, "orders", "audit")) == {"order": order, "item": "book"}

        # The same view inside a transaction that rolls back: no row, no message.
        class Rollback(Exception):
            pass

        with pytest.raises(Rollback), transaction.atomic():
            assert client.post("/orders", {"item": "lamp"}).status_code == 201
            raise Rollback
        assert list(Order.objects.values_list("item", flat=True)) == ["book"]
        assert topic_count(nsqd, "orders") == 1

        # GET is refused before anything is written or published.
        assert client.get("/orders").status_code == 405
        assert topic_count(nsqd, "orders") == 1
    finally:
        producer.close()
        connection.close()
        for name in [m for m in sys.modules if m == "shop" or m.startswith("shop.")]:
            del sys.modules[name]
