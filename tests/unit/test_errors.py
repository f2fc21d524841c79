"""Issue 13: every error gridbot raises on purpose derives from GridbotError, and the command line shows it as
a message with an exit code, never a traceback; a bug (TransitionError) still shows as one."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import gridbot
from gridbot.cli.main import cli, friendly
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.spec import Problem, SpecError
from gridbot.model.states import TransitionError
from gridbot.policy.policies import PolicyError
from gridbot.sim.distributions import DistError
from gridbot.sim.traces import TraceError

SRC = Path(gridbot.__file__).parent
NOT_GRIDBOT_ERRORS = {
    "model.states.TransitionError": "a bug: the server must answer it 500 and the CLI show its traceback",
}


def error_classes() -> list[str]:
    """Every class of src/gridbot whose name ends in Error, as `module.Class`."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error") and node.name != "GridbotError":
                out.append(f"{module}.{node.name}")
    return out


@pytest.mark.parametrize("name", error_classes())
def test_every_error_derives_from_gridbot_error(name):
    module, _, cls_name = name.rpartition(".")
    cls = getattr(importlib.import_module(f"gridbot.{module}"), cls_name)
    if not issubclass(cls, Exception):
        pytest.skip(f"{name} is not an exception (a message body)")
    assert issubclass(cls, GridbotError) != (name in NOT_GRIDBOT_ERRORS), NOT_GRIDBOT_ERRORS.get(name, name)


@pytest.mark.parametrize("cls", [SpecError, PolicyError, DistError, TraceError])
def test_errors_caught_as_value_errors_still_are(cls):
    assert issubclass(cls, ValueError)


def failing(error: BaseException) -> click.Command:
    @click.command()
    @friendly
    def boom() -> None:
        raise error

    return boom


@pytest.mark.parametrize(("error", "code", "words"), [
    (SpecError("s.toml", [Problem("jobs must be at least 1", 3, "jobs = 10")]), 2,
     "s.toml has 1 problem(s):\ns.toml:3: jobs must be at least 1\n  hint: jobs = 10"),
    (PolicyError("Rank", "Host.Speeed", "is undefined on every host", "did you mean Host.Speed?"), 2,
     "error: policy Rank = 'Host.Speeed': is undefined on every host; did you mean Host.Speed?"),
    (DistError("'soon' is not a duration"), 2, "error: 'soon' is not a duration"),
    (TraceError("no trace 'blast'; there are blastall"), 2, "error: no trace 'blast'"),
    (GridbotError("cannot read pools file p.toml"), 2, "error: cannot read pools file p.toml"),
    (ServerUnavailable("no server at http://127.0.0.1:8470"), 1, "error: no server at"),
])
def test_the_cli_prints_gridbots_errors_with_an_exit_code(error, code, words):
    result = CliRunner().invoke(failing(error))
    assert result.exit_code == code and words in result.output, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_a_bug_is_not_dressed_as_a_users_mistake():
    result = CliRunner().invoke(failing(TransitionError("JobState cannot move from done to queued")))
    assert isinstance(result.exception, TransitionError) and result.exit_code == 1


def test_a_wrong_scenario_stops_simulate_with_its_line_and_exit_2(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[server]\nbufer_size = 10\n[pools.a]\nsize = 1\n[bags.b]\njobs = 1\nruntime = "1x"\n')
    result = CliRunner().invoke(cli, ["simulate", str(path), "--quiet"])
    assert result.exit_code == 2, result.output
    assert "has 2 problem(s)" in result.output and "s.toml:2: unknown key 'bufer_size' in [server]" in result.output
    assert "did you mean 'buffer_size'" in result.output and "'1x' is not a duration" in result.output
