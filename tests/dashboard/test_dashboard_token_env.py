"""`crawlq dashboard` and an empty CRAWLQ_DASHBOARD_TOKEN: click takes an empty variable for
no token at all, and the dashboard started open to everyone on what is almost certainly a
deployment's mistake (a secret that did not arrive)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from crawlq.cli.main import cli


def dashboard(tmp_path: Path, token: str | None, *args: str) -> Result:
    """`crawlq dashboard` on a backend that is not there: past the token checks, it stops at
    opening the backend instead of serving."""
    env = {"CRAWLQ_DASHBOARD_TOKEN": token, "CRAWLQ_BACKEND": f"sqlite:///{tmp_path / 'no.db'}"}
    return CliRunner().invoke(cli, ["dashboard", "--port", "0", *args], env=env)


@pytest.mark.parametrize("blank", ["", " ", "\t \n"])
def test_an_empty_token_variable_is_refused_in_one_line(tmp_path: Path, blank: str) -> None:
    ran = dashboard(tmp_path, blank)
    assert ran.exit_code == 1, ran.output
    assert ran.output.startswith("Error: CRAWLQ_DASHBOARD_TOKEN is set but empty:")
    assert ran.output.count("\n") == 1
    assert "secrets.token_urlsafe(32)" in ran.output and "unset it" in ran.output
    assert not (tmp_path / "no.db").exists()


def test_an_unset_variable_or_a_token_on_the_command_line_starts_as_before(
    tmp_path: Path,
) -> None:
    """Unset, the dashboard serves without a token (here it gets as far as the backend, which
    is not there); `--token` wins over an empty variable, as over any."""
    for token, args in [(None, ()), ("", ("--token", secrets.token_urlsafe(32)))]:
        ran = dashboard(tmp_path, token, *args)
        assert ran.exit_code == 1, ran.output
        assert ran.output.startswith("Error: ") and "CRAWLQ_DASHBOARD_TOKEN" not in ran.output
        assert "no.db" in ran.output  # the backend's error: no refusal of the token came first
