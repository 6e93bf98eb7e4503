"""The pytest plugin of :mod:`durable_harness.testing` (the ``pytest11`` entry point): the
:func:`crash_matrix` decorator and the ``crash_cell`` and ``crash_run`` fixtures; tests using
them are marked ``crash``. It imports the crash kit only when a crash test needs it
(``design/testing-kit.md`` "Pieces")."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from durable_harness.crashtest.runner import Decide
    from durable_harness.crashtest.scenario import Scenario
    from durable_harness.recovery.decide import Policy
    from durable_harness.testing.kit import CrashOutcome

MARKER = "crash_matrix"


def crash_matrix(
    source: Scenario | str | Path | dict[str, Any],
    *,
    backends: tuple[str, ...] | list[str] = ("jsonl",),
    decide: Decide | None = None,
    policy: Policy = "ask",
    power_cut: bool | str | Iterable[str] = False,
) -> pytest.MarkDecorator:
    """Decorator: run the test, which takes the ``crash_cell`` fixture, once per ``(crash
    point, hit)`` the scenario reaches on each backend; ids ``<backend>-<point>[:n]``.
    ``source``, ``decide`` and ``policy`` are as for :func:`~durable_harness.testing.kit.run_crash`.
    ``power_cut``: ``False`` (SIGKILL cells), ``True`` (every durability mode), or the mode(s);
    ids are then ``<backend>-<mode>-<point>[:n]``.

    Raises:
        ValueError: ``power_cut`` names something that is not a durability mode (at once).
        FormatError, ImportSpecError, RuntimeError (at collection): the scenario cannot be
            loaded or its crash-free run fails.
    """
    mark: pytest.MarkDecorator = getattr(pytest.mark, MARKER)
    modes = _modes(power_cut)
    return mark(source, backends=tuple(backends), decide=decide, policy=policy, power_cut=modes)


def _modes(power_cut: bool | str | Iterable[str]) -> tuple[str | None, ...]:
    """The durability modes of the cells: ``(None,)`` for SIGKILL cells; ``ValueError`` for a
    mode that is not one."""
    from durable_harness.crashtest.powercut import DURABILITIES

    if power_cut is False:
        return (None,)
    if power_cut is True:
        return DURABILITIES
    modes = (power_cut,) if isinstance(power_cut, str) else tuple(power_cut)
    bad = [m for m in modes if m not in DURABILITIES]
    if bad or not modes:
        raise ValueError(f"power_cut: expected True, False or modes of {DURABILITIES}, got {bad}")
    return modes


@dataclass(frozen=True)
class _Param:
    scenario: Scenario
    point: str
    hit: int
    options: dict[str, Any]  # run_crash's keywords: backend, decide, policy, power_cut


def pytest_configure(config: pytest.Config) -> None:
    """Declare the markers the kit uses."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(scenario, backends, decide, policy, power_cut): run once per crash point",
    )
    config.addinivalue_line("markers", "crash: spawns child processes that SIGKILL themselves")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``crash_cell`` over the crash points of the test's ``crash_matrix``."""
    mark = metafunc.definition.get_closest_marker(MARKER)
    if mark is None or "crash_cell" not in metafunc.fixturenames:
        return
    from durable_harness.testing.kit import crash_points, scenario

    folder = Path(tempfile.mkdtemp(prefix="dh-scenario-"))  # a dict scenario's file
    metafunc.config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    sc = scenario(mark.args[0], folder)
    decide, policy = mark.kwargs.get("decide"), mark.kwargs.get("policy", "ask")
    params, ids = [], []
    for backend in mark.kwargs.get("backends", ("jsonl",)):
        for mode in mark.kwargs.get("power_cut", (None,)):
            for point, hit in crash_points(sc, backend, mode):
                options = {
                    "backend": backend,
                    "decide": decide,
                    "policy": policy,
                    "power_cut": mode,
                }
                params.append(_Param(sc, point, hit, options))
                prefix = f"{backend}-{mode}-" if mode else f"{backend}-"
                ids.append(prefix + point + (f":{hit}" if hit > 1 else ""))
    metafunc.parametrize("crash_cell", params, ids=ids, indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a crash fixture ``crash``."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "crash_cell" in names or "crash_run" in names:
            item.add_marker(pytest.mark.crash)


@pytest.fixture
def crash_cell(request: pytest.FixtureRequest, tmp_path: Path) -> CrashOutcome:
    """The :class:`~durable_harness.testing.kit.CrashOutcome` of this test's crash cell (needs
    ``@crash_matrix`` on the test), run in ``tmp_path`` and kept there for inspection."""
    from durable_harness.testing.kit import run_crash

    p = getattr(request, "param", None)
    if not isinstance(p, _Param):
        raise pytest.UsageError(
            f"{request.node.nodeid}: the crash_cell fixture needs @crash_matrix(scenario) on "
            "the test (from durable_harness.testing)"
        )
    return run_crash(p.scenario, p.point, p.hit, root=tmp_path / "cell", **p.options)


@pytest.fixture
def crash_run(tmp_path: Path) -> Iterator[Callable[..., CrashOutcome]]:
    """``crash_run(scenario, point, hit=1, *, backend="jsonl", decide=None, policy="ask",
    power_cut=None)``: run one crash cell (a power cut in that durability mode, when given) in
    a fresh folder under ``tmp_path`` and return its outcome."""
    from durable_harness.testing.kit import run_crash, scenario

    count = 0

    def run(source: Scenario | str | Path | dict[str, Any], *args: Any, **kw: Any) -> CrashOutcome:
        nonlocal count
        count += 1
        sc = scenario(source, tmp_path / f"scenario-{count}")
        return run_crash(sc, *args, root=tmp_path / f"cell-{count}", **kw)

    yield run
