"""Shared fixtures: a fixed clock and the paths of committed test data."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def now() -> datetime:
    return datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
