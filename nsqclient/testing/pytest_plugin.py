"""pytest fixtures for tests that need an NSQ broker: a plugin a project turns on itself.

Installing nsqclient does not load it (no ``pytest11`` entry point); a project's top
``conftest.py`` says ``pytest_plugins = ["nsqclient.testing.pytest_plugin"]``, or its run says
``-p nsqclient.testing.pytest_plugin`` (docs/testing.rst).

The broker is the embedded NSQ (:class:`nsqclient.testing.EmbeddedNSQ`) unless the environment
variable ``NSQ_BIN_DIR`` names a directory holding real ``nsqd`` and ``nsqlookupd`` binaries; then
it is :class:`nsqclient.testing.real.RealNSQ`.  Either way the tests see the same Cluster
interface.

Fixtures:
    nsq_broker_kind       "real" or "embedded" (session-scoped).
    nsq_cluster_factory   ``make(nsqd_count=1, lookupd=True, **nsqd_options) -> Cluster``,
                          started; every cluster made is closed at teardown.
    nsqd                  a started 1-nsqd cluster with nsqlookupd.
    nsq_cluster           a started 3-nsqd cluster with nsqlookupd.
    auth_server           ``make(secrets, **kwargs) -> AuthServer``, started; closed at teardown.

Markers:
    embedded_only   skipped when the broker is real (the test needs an embedded fault control).
    real_only       skipped when the broker is embedded.

When a test fails against real binaries, the tail of each process log is attached to the
report.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

import pytest

from .auth_server import AuthServer

log = logging.getLogger("nsqclient.testing.pytest_plugin")

_CLUSTERS_KEY = pytest.StashKey[list[Any]]()


def real_bin_dir() -> str | None:
    """``$NSQ_BIN_DIR`` if it holds executable ``nsqd`` and ``nsqlookupd``, else None."""
    bin_dir = os.environ.get("NSQ_BIN_DIR")
    if not bin_dir:
        return None
    if all(os.access(os.path.join(bin_dir, b), os.X_OK) for b in ("nsqd", "nsqlookupd")):
        return bin_dir
    return None


def broker_kind() -> str:
    """``"real"`` when real binaries are available through ``NSQ_BIN_DIR``, else ``"embedded"``."""
    return "real" if real_bin_dir() else "embedded"


def _embedded_class() -> type:
    # Imported lazily: the embedded NSQ is a sizeable module and tests against real
    # binaries do not need it.
    from .cluster import EmbeddedNSQ

    return EmbeddedNSQ


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_only: runs only against real nsqd binaries (NSQ_BIN_DIR)"
    )
    config.addinivalue_line(
        "markers", "embedded_only: exercises a fault control only the embedded NSQ has"
    )
    if os.environ.get("NSQ_BIN_DIR") and real_bin_dir() is None:
        warnings.warn(
            f"NSQ_BIN_DIR={os.environ['NSQ_BIN_DIR']!r} holds no executable nsqd and "
            "nsqlookupd; using the embedded NSQ",
            stacklevel=1,
        )


def pytest_report_header(config: pytest.Config) -> str:
    kind = broker_kind()
    where = f" from {real_bin_dir()}" if kind == "real" else ""
    return f"nsq broker: {kind}{where}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kind = broker_kind()
    for item in items:
        if kind == "real" and item.get_closest_marker("embedded_only"):
            item.add_marker(pytest.mark.skip(reason="needs the embedded NSQ (NSQ_BIN_DIR is set)"))
        elif kind == "embedded" and item.get_closest_marker("real_only"):
            item.add_marker(pytest.mark.skip(reason="needs real nsqd binaries (set NSQ_BIN_DIR)"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    clusters: list[Any] = item.stash.get(_CLUSTERS_KEY, [])
    for i, cluster in enumerate(clusters):
        tail = getattr(cluster, "log_tail", None)
        if tail is None:
            continue
        try:
            text = tail()
        except Exception as exc:  # diagnostics must never mask the failure
            text = f"(could not read the logs: {exc})"
        report.sections.append((f"nsq cluster {i} logs ({report.when})", text))


@pytest.fixture(scope="session")
def nsq_broker_kind() -> str:
    """``"real"`` if NSQ_BIN_DIR holds nsqd and nsqlookupd, else ``"embedded"``."""
    return broker_kind()


@pytest.fixture
def nsq_cluster_factory(
    request: pytest.FixtureRequest,
    nsq_broker_kind: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., Any]]:
    """A factory ``make(nsqd_count=1, lookupd=True, **nsqd_options)`` returning a started
    cluster of the session's broker kind; all clusters it made are closed at teardown."""
    clusters: list[Any] = []
    request.node.stash[_CLUSTERS_KEY] = clusters

    def make(nsqd_count: int = 1, lookupd: bool = True, **nsqd_options: Any) -> Any:
        if nsq_broker_kind == "real":
            if nsqd_options.get("lookupd_legacy_json"):
                pytest.skip("lookupd_legacy_json is an embedded-only option")
            from .real import RealNSQ

            cluster = RealNSQ(
                nsqd_count=nsqd_count,
                lookupd=lookupd,
                data_dir=tmp_path_factory.mktemp("nsq-real"),
                bin_dir=real_bin_dir(),
                **nsqd_options,
            )
        else:
            cluster = _embedded_class()(nsqd_count=nsqd_count, lookupd=lookupd, **nsqd_options)
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield make

    errors = []
    for cluster in reversed(clusters):
        try:
            cluster.close()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise RuntimeError(f"closing NSQ clusters failed: {errors}")


@pytest.fixture
def nsqd(nsq_cluster_factory: Callable[..., Any]) -> Any:
    """A started cluster of one nsqd and one nsqlookupd."""
    return nsq_cluster_factory(nsqd_count=1, lookupd=True)


@pytest.fixture
def nsq_cluster(nsq_cluster_factory: Callable[..., Any]) -> Any:
    """A started cluster of three nsqds and one nsqlookupd."""
    return nsq_cluster_factory(nsqd_count=3, lookupd=True)


@pytest.fixture
def auth_server() -> Iterator[Callable[..., AuthServer]]:
    """A factory ``make(secrets, **kwargs) -> AuthServer`` (started, on a free loopback port);
    every server made is closed at teardown.  See :class:`AuthServer` for ``secrets``."""
    servers: list[AuthServer] = []

    def make(secrets: Mapping[str, Mapping[str, Any]], **kwargs: Any) -> AuthServer:
        server = AuthServer(secrets, **kwargs)
        servers.append(server)
        return server.start()

    yield make

    for server in reversed(servers):
        server.close()
