"""Fixtures of the chaos tests: a scratch folder per test on the disk (never a tmpfs of our
own making unless the test mounts one), and a backend URL per backend kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import BACKENDS, backend_url


@pytest.fixture(params=BACKENDS)
def chaos_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, tmp_path, request)
