"""Shared test configuration: hypothesis profiles and the location of the shared pi files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

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
