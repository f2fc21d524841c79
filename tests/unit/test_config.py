"""Issue 13: every dispatcher default is declared once, in DispatchConfig's fields; `gridbot server`'s options
and a scenario's `[server]` keys are made from them and cannot drift apart."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gridbot.cli.main import cli
from gridbot.cli.options import DISPATCH_SECTION
from gridbot.core.config import DispatchConfig, knobs
from gridbot.model.spec import SpecError
from gridbot.sim.scenario import SERVER_KEYS, parse_scenario

UNEXPOSED = {"check_invariants", "seed"}
"""Fields set in code only: invariant checks are for tests; the seed is the scenario's own ([simulation])."""
SERVER_ONLY = {"max_result_bytes"}
"""An option without a scenario key: the simulator sends no results."""
POOLS = '[pools.a]\nsize = 2\n[pools.b]\nsize = 2\n[bags.x]\njobs = 1\nruntime = 1\n'
SAMPLES = {
    "count": ("7", 7),
    "seconds": ("90", 90.0),
    "flag": (None, True),
    "pools": ("a", frozenset({"a"})),
    "size": ("4K", 4096),
}
"""A value of each kind, as an option takes it and as the field holds it."""


def server_options() -> dict[str, click.Option]:
    command = cli.commands["server"]
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}


class Store:
    def close(self) -> None:
        pass


def run_server(monkeypatch, tmp_path, *args: str) -> DispatchConfig:
    """The DispatchConfig `gridbot server ARGS` would run with (stopped before it opens a port)."""

    class Started(Exception):
        pass

    def service(store, config, **kwargs):
        raise Started(config)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gridbot.store.sql.open_store", lambda db: Store())
    monkeypatch.setattr("gridbot.server.service.Service", service)
    result = CliRunner().invoke(cli, ["server", "--no-auth", *args])
    assert isinstance(result.exception, Started), result.output
    return result.exception.args[0].dispatch


def test_every_field_is_exposed_or_deliberately_not():
    names = {f.name for f in dataclasses.fields(DispatchConfig)}
    exposed = {k.name for k in knobs()}
    assert exposed | UNEXPOSED == names and not exposed & UNEXPOSED
    assert {k.name for k in knobs() if not k.scenario} == SERVER_ONLY
    assert all(k.option for k in knobs()), "every exposed field is a server option"


def test_each_exposed_field_has_one_option_and_one_key_with_its_default():
    options = server_options()
    flags = [f for p in options.values() for f in p.opts]
    assert len(flags) == len(set(flags))
    for k in knobs():
        option = options[k.name]
        assert option.opts == [k.option], k.name
        assert option.help == k.help and k.help, k.name
        if k.kind == "pools":
            assert option.multiple
        else:
            assert option.type_cast_value(click.Context(cli.commands["server"]), option.default) == k.default
    assert list(SERVER_KEYS) == [k.name for k in knobs() if k.scenario]
    assert parse_scenario(POOLS, "s.toml").dispatch == DispatchConfig()


def test_the_server_runs_with_the_defaults_of_the_fields(monkeypatch, tmp_path):
    assert run_server(monkeypatch, tmp_path) == DispatchConfig()


@pytest.mark.parametrize("knob", knobs(), ids=lambda k: k.name)
def test_an_option_and_a_key_set_the_same_field(monkeypatch, tmp_path, knob):
    text, value = SAMPLES[knob.kind]
    failover = knob.name == "failover_after"  # refused without a reliable pool
    config = run_server(monkeypatch, tmp_path, knob.option, *([text] if text is not None else []),
                        *(["--reliable-pool", "a"] if failover else []))
    assert getattr(config, knob.name) == value
    unset = {knob.name: knob.default, **({"reliable_pools": frozenset()} if failover else {})}
    assert dataclasses.replace(config, **unset) == DispatchConfig()
    if knob.scenario:
        written = {"pools": '["a"]', "flag": "true"}.get(knob.kind, text)
        also = 'reliable_pools = ["a"]\n' if failover else ""
        scenario = parse_scenario(f"[server]\n{knob.name} = {written}\n{also}{POOLS}", "s.toml")
        assert scenario.dispatch == config


def test_the_run_command_takes_the_result_size_of_the_same_field():
    option = next(p for p in cli.commands["run"].params if p.name == "max_result_bytes")
    assert option.opts == ["--max-result-size"] and option.help == server_options()["max_result_bytes"].help


def test_the_help_lists_the_dispatcher_options_apart():
    result = CliRunner().invoke(cli, ["server", "--help"], terminal_width=100)
    assert result.exit_code == 0
    general, dispatcher = result.output.split(DISPATCH_SECTION)
    for k in knobs():
        assert k.option in (dispatcher if k.scenario else general), k.name
    assert "--heartbeat" in general and "--max-result-size SIZE" in general and "[default: 16M]" in general


@pytest.mark.parametrize(("args", "words"), [
    (["--buffer-size", "0"], "0 is not in the range x>=1"),
    (["--host-timeout", "0.5"], "0.5 is not in the range x>=1"),
    (["--backoff-max", "0"], "0.0 is not in the range x>0"),
    (["--max-result-size", "lots"], "'lots' is not a size"),
    (["--max-result-size", "0"], "0 is below the least that works, 1K"),
    (["--failover-after", "2"], "--failover-after needs at least one --reliable-pool"),
    (["--replicas-first", "--replicas-mixed"], "--replicas-first sends replicas before the queued jobs and "
                                               "--replicas-mixed mixes them in: give one"),
])
def test_a_wrong_option_is_refused_with_exit_2(monkeypatch, tmp_path, args, words):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gridbot.store.sql.open_store", lambda db: Store())
    result = CliRunner().invoke(cli, ["server", "--no-auth", *args])
    assert result.exit_code == 2 and words in result.output, result.output


@pytest.mark.parametrize(("line", "words", "hint"), [
    ("buffer_sise = 10", "unknown key 'buffer_sise' in [server]", "did you mean 'buffer_size'"),
    ("max_result_bytes = 10", "unknown key 'max_result_bytes' in [server]", "the keys are buffer_size"),
    ("check_invariants = true", "unknown key 'check_invariants' in [server]", "the keys are"),
    ('buffer_size = "big"', "server.buffer_size: must be a whole number of at least 1, not 'big'", ""),
    ("max_replicas = 0", "server.max_replicas: must be a whole number of at least 1, not 0", ""),
    ("tail_threshold = 1.5", "server.tail_threshold: must be a whole number of at least 0, not 1.5", ""),
    ("tail_sticky = 1", "server.tail_sticky: must be true or false, not 1", ""),
    ('host_timeout = "0.5s"', "server.host_timeout: must be at least 1 s, not '0.5s'", ""),
    ("backoff_max = 0", "server.backoff_max: 0 must be more than zero", ""),
    ('retry_same_host_after = "soon"', "server.retry_same_host_after: 'soon' is not a duration", ""),
    ('reliable_pools = "a"', "server.reliable_pools: must be a list of pool names", ""),
])
def test_a_wrong_server_key_is_named_with_its_line_and_fix(line, words, hint):
    with pytest.raises(SpecError) as e:
        parse_scenario(f"[server]\n{line}\n{POOLS}", "s.toml")
    [problem] = e.value.problems
    assert problem.line == 2 and words in problem.message and hint in problem.hint, problem


def test_replicas_first_and_mixed_are_refused_together_in_a_scenario():
    with pytest.raises(SpecError) as e:
        parse_scenario(f"[server]\nreplicas_first = true\nreplicas_mixed = true\n{POOLS}", "s.toml")
    [problem] = e.value.problems
    assert problem.line == 3 and "give one" in problem.message and "remove one" in problem.hint, problem
    with pytest.raises(ValueError, match="give one"):  # (code that builds a config itself)
        DispatchConfig(replicas_first=True, replicas_mixed=True)


def test_the_simulation_docs_name_every_server_key():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "simulation.md").read_text()
    section = docs.split("### `[server]`", 1)[1].split("###", 1)[0]
    assert [key for key in SERVER_KEYS if f"`{key}`" not in section] == []


def test_the_log_level_takes_any_case():
    """Found by the docs review of 2026-11-29: GRIDBOT_LOG_LEVEL=INFO, the way log levels are usually written,
    was refused."""
    assert CliRunner().invoke(cli, ["--log-level", "INFO", "access", "--help"]).exit_code == 0
    assert CliRunner().invoke(cli, ["access", "--help"], env={"GRIDBOT_LOG_LEVEL": "Debug"}).exit_code == 0
    for args, env in ((["--log-level", "loud"], {}), ([], {"GRIDBOT_LOG_LEVEL": "loud"})):
        wrong = CliRunner().invoke(cli, [*args, "access", "--help"], env=env)
        assert wrong.exit_code == 2 and "'loud' is not one of" in wrong.output, wrong.output


def test_a_worker_of_billions_of_slots_is_refused_before_it_allocates_them():
    """Found by the bad-input hunt: `gridbot worker --slots 3000000000` built a list of its free slots, 3.7 GB in
    6 s, without a word (and a pools file's `cpus` becomes its pilots' --slots)."""
    for option in ("--slots", "--prefetch"):
        result = CliRunner().invoke(cli, ["worker", option, "3000000000", "--server", "http://127.0.0.1:1"])
        assert result.exit_code == 2, result.output
        assert "3000000000 is not in the range" in result.output and "65536" in result.output, result.output
