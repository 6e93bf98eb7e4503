"""Shared test configuration: hypothesis profiles and the location of the shared pi files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from durable_harness.storage import shapes as _shapes

# Records the harness builds are not re-checked at commit in production (they are declared-shape
# by construction: design/api.md); the suite checks them all, here and in every child process it
# starts, so a harness change that builds a malformed record fails a test.
os.environ["DURABLE_HARNESS_CHECK_ALL_RECORDS"] = "1"
_shapes.CHECK_TRUSTED = True

# ``ci`` is the default (``make test`` also passes ``--hypothesis-profile=ci``); ``dev`` runs
# fewer examples for a quick local loop: ``pytest --hypothesis-profile=dev``.
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=15, deadline=None)
settings.load_profile("ci")

PI_DIR = Path(__file__).parent.parent.parent / "shared" / "data" / "pi-sessions"


@pytest.fixture
def pi_dir() -> Path:
    """The shared folder of real pi session files (read in place, never copied or modified)."""
    if not PI_DIR.is_dir():
        pytest.skip(f"shared pi session files not found at {PI_DIR}: the tests read them in place")
    return PI_DIR


@pytest.fixture(scope="session")
def unprivileged(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """An argv prefix that runs a command without the override of file permissions.

    CI runs as root, and root reads a mode-000 file: a test of an unreadable file must run its
    reader through this prefix (``setpriv`` dropping ``CAP_DAC_OVERRIDE`` and
    ``CAP_DAC_READ_SEARCH`` from the inheritable and bounding sets). Empty when not root. The
    prefix is checked once against a real mode-000 file, so a test using it cannot pass vacuously.
    """
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux): cannot drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search"
    prefix = [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}", "--"]
    probe = tmp_path_factory.mktemp("unprivileged") / "probe"
    probe.write_text("secret")
    probe.chmod(0)
    proc = subprocess.run([*prefix, "cat", str(probe)], capture_output=True, text=True)
    assert proc.returncode != 0 and "secret" not in proc.stdout, (
        f"setpriv did not drop CAP_DAC_OVERRIDE: {proc.stderr}"
    )
    return prefix


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A throw-away PostgreSQL cluster for the whole run (``initdb`` + ``pg_ctl`` as an
    unprivileged user, a free loopback port; stopped and removed at the end): a
    :class:`~durable_harness.testing.pgcluster.TemporaryCluster`. Without the server binaries
    the tests that use it skip naming PostgreSQL; under ``CI=true`` they error instead."""
    from durable_harness.testing.pgcluster import TemporaryCluster, find_bindir, missing_postgres

    bindir = find_bindir()
    if bindir is None:
        missing_postgres(
            "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in "
            "/usr/lib/postgresql/*/bin: install the server (apt-get install postgresql)"
        )
    assert bindir is not None
    cluster = TemporaryCluster(bindir)
    try:
        cluster.start()
    except BaseException:
        cluster.cleanup()
        raise
    yield cluster
    cluster.cleanup()


@pytest.fixture
def pg_spec_factory(pg_cluster: Any) -> Iterator[Callable[[], str]]:
    """``make()`` returns the spec of a fresh, empty PostgreSQL store (a schema of its own in
    the run's cluster: ``?options=-csearch_path=...``); every one is dropped after the test."""
    import uuid

    from durable_harness.storage.postgres.connection import Database

    made: list[tuple[str, str]] = []

    def make() -> str:
        schema = f"t_{uuid.uuid4().hex[:16]}"
        pg_cluster.execute(f"CREATE SCHEMA {schema}")
        spec = f"{pg_cluster.spec}?options=-csearch_path%3D{schema}"
        made.append((schema, spec))
        return spec

    yield make
    for schema, spec in made:
        Database.forget(spec)
        pg_cluster.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def pg_spec(pg_spec_factory: Callable[[], str]) -> str:
    """The spec of one fresh, empty PostgreSQL store (see ``pg_spec_factory``)."""
    return pg_spec_factory()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--anyio-backends=asyncio``: the tests parametrized by ``anyio_backend`` (the harness,
    providers and tools run each async test on asyncio and on trio) run on those backends only;
    the others are deselected. ``make check`` (the edit loop's fast lane) runs asyncio alone;
    ``make test`` runs both."""
    parser.addoption(
        "--anyio-backends",
        default="asyncio,trio",
        help="comma-separated anyio backends to run the anyio_backend-parametrized tests on",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses the PostgreSQL cluster carries the ``postgres`` marker; the tests
    of a backend left out of ``--anyio-backends`` are deselected; then the files are ordered
    longest first (:func:`_longest_first`)."""
    backends = set(str(config.getoption("anyio_backends")).split(","))
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        if "pg_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
        params = getattr(getattr(item, "callspec", None), "params", {})
        backend = params.get("anyio_backend")
        (dropped if backend is not None and backend not in backends else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    _longest_first(items)


# The files that took longest in measured runs (issue 22; design/architecture.md "Suite time"),
# longest first: they start before every other file. Most wait on something else than the
# CPU (fsync, a server's outage, a child's pip install or fuzzing run, the demo's children), so
# starting them early overlaps their waits with the other worker's CPU work. A file missing
# here only starts later; nothing depends on this list but the wall time.
LONG_FILES = (
    "tests/storage/test_stateful.py",
    "tests/bench/test_bench_restart.py",
    "tests/http_api/test_schemathesis.py",
    "tests/cli/test_demo.py",
    "tests/kit/test_wheel.py",
    "tests/crashtest/test_stateful.py",
    "tests/crashtest/test_broken_build.py",
    "tests/recovery/test_crash_points.py",
    "tests/recovery/test_plan_is_program.py",
    "tests/session/test_real_pi.py",
)


def _longest_first(items: list[pytest.Item]) -> None:
    """Order the files so that the longest start first (issue 22). ``make test`` hands out
    whole files in this order (``--dist loadfile --no-loadscope-reorder``); a long file handed
    out last runs alone on one core while the other idles. First the matrix's file (the tests
    taking ``full_matrix``: the suite's longest step), then :data:`LONG_FILES` in their order,
    then the files by how many of their tests are marked ``slow`` or ``crash`` (a test that
    took a second or more, or starts processes that crash), most first; the others keep their
    order. Within a file the order is the file's own."""
    weight: dict[str, int] = {}
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        w = weight.setdefault(file, 0)
        if "full_matrix" in getattr(item, "fixturenames", ()):
            w = 2_000_000
        elif file in LONG_FILES:
            w = 1_000_000 - LONG_FILES.index(file)
        elif item.get_closest_marker("slow") or item.get_closest_marker("crash"):
            w += 1
        weight[file] = w
    items.sort(key=lambda item: -weight[item.nodeid.split("::", 1)[0]])
