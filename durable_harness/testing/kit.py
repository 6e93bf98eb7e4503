"""The pytest-free core of :mod:`durable_harness.testing`: one crash cell of a scenario, run by
the crash matrix's runner (:mod:`durable_harness.crashtest.runner`; ``design/testing-kit.md``)."""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable_harness.crashtest.invariants import INVARIANTS as INVARIANTS
from durable_harness.crashtest.powercut import DURABILITIES
from durable_harness.crashtest.runner import (
    Baseline,
    Cell,
    Decide,
    baseline,
    cells_for,
    run_cell,
    store_spec,
)
from durable_harness.crashtest.scenario import Scenario, load
from durable_harness.errors import FormatError
from durable_harness.recovery.decide import Policy
from durable_harness.session.session import Session
from durable_harness.storage import codec, open_store

BACKENDS = ("jsonl", "sqlite")
POWER_CUT_MODES = DURABILITIES
"""The durability modes a power-cut cell can run in: ``("sync", "batch", "none")``."""


def scenario(
    source: Scenario | str | Path | dict[str, Any], folder: Path | None = None
) -> Scenario:
    """Turn ``source`` (a loaded scenario, a scenario file, or its content as a dict) into a
    loaded :class:`Scenario`; a dict is written to ``folder`` (default: a new temporary folder)
    because the child process reads the scenario from a file.

    Raises:
        FormatError: the scenario does not follow the format (the message names the file), or
            ``source`` is of another type.
    """
    if isinstance(source, Scenario):
        return source
    if isinstance(source, str | Path):
        return load(Path(source).resolve())
    if not isinstance(source, dict):
        raise FormatError(f"a scenario is a file path or a dict, got {type(source).__name__}")
    made = folder is None
    folder = folder or Path(tempfile.mkdtemp(prefix="dh-scenario-"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{source.get('name') or 'scenario'}.json"
        path.write_bytes(codec.dumps(source))
        return load(path)
    except BaseException:
        if made:  # a scenario that fails leaves no folder of ours behind
            shutil.rmtree(folder, ignore_errors=True)
        raise


_BASELINES: dict[tuple[str, str, str | None], Baseline] = {}
_LOCK = threading.Lock()


def _check_mode(power_cut: str | None) -> None:
    if power_cut is not None and power_cut not in DURABILITIES:
        raise ValueError(f"power_cut must be one of {DURABILITIES} or None, got {power_cut!r}")


def crash_free(sc: Scenario, backend: str = "jsonl", power_cut: str | None = None) -> Baseline:
    """The scenario's crash-free run on ``backend`` (in mode ``power_cut``), cached per process.

    Raises:
        ValueError: ``power_cut`` is not a durability mode.
        RuntimeError: the crash-free child failed (its stderr is in the message).
        ImportSpecError: the scenario's tools or provider cannot be loaded.
    """
    _check_mode(power_cut)
    key = (str(Path(sc.path).resolve()), backend, power_cut)
    with _LOCK:
        if key not in _BASELINES:
            _BASELINES[key] = baseline(sc, backend, durability=power_cut)
        return _BASELINES[key]


def crash_points(
    sc: Scenario, backend: str = "jsonl", power_cut: str | None = None
) -> list[tuple[str, int]]:
    """Every ``(crash point, hit)`` the scenario reaches (hits up to ``runner.MAX_HITS``), in a
    stable order. Raises as :func:`crash_free`."""
    base = crash_free(sc, backend, power_cut)
    return [(c.point, c.hit) for c in cells_for(sc, base, backend, power_cut)]


@dataclass
class CrashOutcome:
    """What one crash cell did (``cell``: the runner's verdict), and where its files are kept:
    ``root`` the cell's folder, ``work`` the agent's working directory, ``store_spec`` and
    ``session_id`` its session."""

    cell: Cell
    root: Path
    work: Path
    store_spec: str
    session_id: str

    @property
    def power_cut(self) -> str | None:
        """The durability mode whose power cut the cell simulated, or ``None``."""
        return self.cell.durability

    @property
    def lost(self) -> dict[str, list[str]]:
        """What the power cut lost, ids by kind (``inputs``, ``unacknowledged``, ``intents``,
        ``settlements``; only kinds that lost something; ``design/testing-kit.md``)."""
        return dict(self.cell.lost)

    @property
    def awaiting_decision(self) -> list[str]:
        """Tool call ids that waited for an operator's decision after the crash (not those
        the resume policy decided: see ``cell.decisions``)."""
        return [d.split("=", 1)[0] for d in self.cell.decisions if "=policy:" not in d]

    @property
    def reconciled(self) -> list[str]:
        """Tool call ids whose result a tool's ``reconcile`` established."""
        return list(self.cell.reconciled)

    @property
    def doubled(self) -> list[str]:
        """Effects counted more than once (``effects.log`` tags, ``tool:effect`` keys)."""
        return list(self.cell.doubled)

    def assert_invariants(self) -> None:
        """Assert every invariant of :data:`INVARIANTS` (and the power-cut one) held.

        Raises:
            AssertionError: the cell failed or errored; the message lists what broke.
        """
        assert self.cell.status == "pass", (
            f"{self.cell.backend} {self.cell.scenario} crash at {self.cell.label}: "
            f"{self.cell.status}: " + "; ".join(self.cell.failures)
        )

    def open_session(self) -> Session:
        """Open the cell's session read-only (a context manager); ``StorageError`` if it cannot."""
        store = open_store(self.store_spec, create=False)
        return Session(store.open_session(self.session_id, write=False))


def run_crash(
    sc: Scenario,
    point: str,
    hit: int = 1,
    *,
    backend: str = "jsonl",
    root: Path | None = None,
    decide: Decide | None = None,
    policy: Policy = "ask",
    power_cut: str | None = None,
) -> CrashOutcome:
    """Run one cell: ``sc`` SIGKILLed (or power-cut in durability mode ``power_cut``) at the
    ``hit``-th pass of ``point``, then recovered, decided (``decide``, ``policy``), resumed,
    re-sent and checked; a broken invariant raises nothing (call
    :meth:`CrashOutcome.assert_invariants`). ``root``: an empty or missing folder where the
    cell runs and is kept (default: a new temporary folder, also kept).

    Raises:
        ValueError: ``backend`` is not ``jsonl`` or ``sqlite``, or ``power_cut`` is not a
            durability mode.
        RuntimeError, ImportSpecError: as :func:`crash_free`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    _check_mode(power_cut)
    base = crash_free(sc, backend, power_cut)  # raises before any folder of ours exists
    made = root is None
    root = root or Path(tempfile.mkdtemp(prefix=f"dh-crash-{sc.name}-"))
    try:
        cell = run_cell(
            sc,
            base,
            Cell(sc.name, backend, point, hit, durability=power_cut),
            decide=decide,
            policy=policy,
            root=root,
        )
    except BaseException:
        if made:  # no outcome to inspect it through: nothing left behind
            shutil.rmtree(root, ignore_errors=True)
        raise
    sid = root / "sid"
    return CrashOutcome(
        cell,
        root,
        root / "work",
        store_spec(backend, root),
        sid.read_text().strip() if sid.exists() else "",
    )
