"""Bag specs: what users write, what it expands to, and the errors they get for mistakes."""

import pytest

from gridbot.model.spec import SpecError, each_line_spec, parse_duration, parse_lines, parse_spec

GOOD = """\
name = "sweep"
command = "sim --alpha {alpha} --seed {seed} --mode {mode}"
outputs = ["out-{seed}.txt"]
max_failures = 5
instance_deadline = "2h"
timeout = 90

[env]
MODE = "{mode}"

[parameters]
alpha = { from = 0.1, to = 0.5, step = 0.1 }
seed = { from = 1, to = 3 }
mode = ["fast", "exact"]
"""


def problems(text, **kw):
    with pytest.raises(SpecError) as info:
        parse_spec(text, "s.toml", "s", **kw)
    return [(p.line, p.message, p.hint) for p in info.value.problems]


def test_sweep_is_the_cartesian_product_first_parameter_slowest():
    spec = parse_spec(GOOD, "s.toml", "s")
    assert spec.sweep_size == 5 * 3 * 2
    assert spec.params(0) == {"alpha": "0.1", "seed": "1", "mode": "fast"}
    assert spec.params(1) == {"alpha": "0.1", "seed": "1", "mode": "exact"}
    assert spec.params(2) == {"alpha": "0.1", "seed": "2", "mode": "fast"}
    assert spec.params(29) == {"alpha": "0.5", "seed": "3", "mode": "exact"}
    assert [spec.params(i)["alpha"] for i in range(0, 30, 6)] == ["0.1", "0.2", "0.3", "0.4", "0.5"]


def test_render_fills_command_env_and_outputs():
    spec = parse_spec(GOOD, "s.toml", "s")
    command, env, outputs = spec.render(7)
    assert command == "sim --alpha 0.2 --seed 1 --mode exact"
    assert env["MODE"] == "exact" and env["GRIDBOT_PARAM_ALPHA"] == "0.2"
    assert outputs == ["out-1.txt"]
    assert spec.instance_deadline == 7200 and spec.timeout == 90 and spec.max_failures == 5


def test_descending_and_integer_ranges_and_literal_braces():
    spec = parse_spec('command = "echo {{x}} {n}"\n[parameters]\nn = { from = 10, to = 0, step = -5 }\n', "s", "s")
    assert [spec.render(i)[0] for i in range(spec.sweep_size)] == ["echo {x} 10", "echo {x} 5", "echo {x} 0"]


def test_no_parameters_is_one_job():
    spec = parse_spec('command = "hostname"', "s.toml", "s")
    assert spec.sweep_size == 1 and spec.render(0)[0] == "hostname" and spec.name == "s"


def test_each_line():
    assert parse_lines("echo a\n\n  echo b  \n", "f") == ["echo a", "echo b"]
    assert each_line_spec("f").render(0, "echo a")[0] == "echo a"


def test_every_problem_is_reported_with_its_line_and_a_hint():
    found = problems('name = "x"\ncomand = "a"\ncommand = "run {alpah}"\n[parameters]\nalpha = [1]\n'
                     'beta = { from = 5, to = 1 }\n')
    assert (2, "unknown key 'comand'", "did you mean 'command'?") in found
    assert (3, "placeholder {alpah} in 'command' names no parameter", "did you mean 'alpha'?") in found
    assert any(line == 6 and "is empty" in msg for line, msg, _ in found)


@pytest.mark.parametrize(("text", "line", "needle"), [
    ('command = "x\n', 1, "TOML syntax error"),
    ('command = "x"\n[parameters]\na = []\n', 3, "has no values"),
    ('command = "x"\n[parameters]\na = { from = 1, to = 2, step = 0 }\n', 3, "step 0"),
    ('command = "x"\n[parameters]\na = { form = 1, to = 2 }\n', 3, "unknown key 'form'"),
    ('command = "x"\noutputs = ["../escape"]\n', 2, "relative path inside"),
    ('command = "x"\ninstance_deadline = "soon"\n', 2, "duration"),
    ('command = "x {a:03d}"\n[parameters]\na = [1]\n', 1, "in 'command': '{a:03d}' is not a placeholder"),
    # a lone brace was Python's words alone ("Single '{' encountered in format string"), naming neither the key
    # nor the fix (API review of 2026-12-07)
    ('command = "echo {"\n', 1, "in 'command': a brace that opens or closes no placeholder"),
    ('command = "echo {a}}"\n[parameters]\na = [1]\n', 1, "write {name} for a parameter, and {{ or }} for a literal"),
    ('command = "x"\n[env]\nA = "{"\n', 2, "in 'env': a brace that opens or closes no placeholder"),
    ('name = "has space"\ncommand = "x"\n', 1, "not allowed"),
    ('command = "x"\ninputs = ["a/data.txt", "b/data.txt"]\n', 2, "both be staged"),
    ('name = "x"\n', None, "no 'command'"),
])
def test_bad_specs(text, line, needle):
    found = problems(text)
    assert any(needle in msg and ln == line for ln, msg, _ in found), found


BIG = "1" + "0" * 400


@pytest.mark.parametrize(("key", "needle"), [
    ("timeout", "a duration must be at most 1,000,000,000 s (about 31 years)"),
    ("instance_deadline", "a duration must be at most"),
    ("bag_deadline", "a bag deadline after submission: a duration must be at most"),
    ("budget", "'budget' must be a finite number >= 0, not 1000000000"),
    ("memory", "a size must be at most 1 EiB"),
    ("max_failures", "is more than 2,147,483,647"),
])
def test_an_integer_too_large_for_a_float_is_refused_not_a_crash(key, needle):
    """TOML takes integers of any size; float() of one of 401 digits raised OverflowError out of `gridbot run` and
    `gridbot submit` (CLI review of 2026-12-07). The message shows the value cut, not its 401 digits."""
    found = problems(f'command = "true"\n{key} = {BIG}\n')
    assert [(ln, needle in msg) for ln, msg, _ in found] == [(2, True)], found
    assert all(len(msg) < 300 for _, msg, _ in found), found


def test_sweep_over_the_limit_is_refused():
    found = problems('command = "x {a}"\n[parameters]\na = { from = 1, to = 1000 }\n', max_jobs=999)
    assert found == [(2, "the sweep has 1,000 jobs, over the limit of 999",
                      "split it into several bags, or raise the limit with --max-jobs")]


def test_error_text_names_file_and_line():
    with pytest.raises(SpecError, match=r"^s.toml:2: unknown key 'comand'\n  hint: did you mean 'command'\?"):
        parse_spec('command = "x"\ncomand = "y"\n', "s.toml", "s")


def test_durations():
    assert parse_duration("90s") == 90 and parse_duration("10m") == 600 and parse_duration(2.5) == 2.5
    assert parse_duration("1d") == 86400
    for bad in ("-1", "0", "1w", True, None):
        with pytest.raises(ValueError):
            parse_duration(bad)


@pytest.mark.parametrize(("text", "needle"), [
    ("1e300", "at most 1,000,000,000 s (about 31 years), not 1e+300 s"), ("1e9999", "at most 1,000,000,000 s"),
    ("-5", "must be positive (more than 0 s, at most 1,000,000,000 s), not -5 s"), ("-2h", "not -7200 s")])
def test_a_duration_out_of_range_says_so_not_that_it_is_no_duration(text, needle):
    """Found by the bad-input hunt: `--timeout 1e300` or `-5` (a string, as a command line option gives it)
    was 'a duration is a number of seconds or a string like ...', as if it were written wrong, not too large."""
    with pytest.raises(ValueError) as e:
        parse_duration(text)
    assert needle in str(e.value) and "a duration is a number" not in str(e.value), str(e.value)
    assert parse_duration("1e3") == 1000.0, "a number in range is read as one"
    with pytest.raises(ValueError, match=r"positive or 0 \(at most 1,000,000,000 s\), not -5 s"):
        parse_duration("-5", zero=True)


@pytest.mark.parametrize("text", [
    'command = "true"\n[parameters]\ni = { from = 1, to = 50 }\n',
    'command = "run {i} > out"\n[parameters]\ni = { from = 0, to = 90, step = 3 }\n',
    'command = "x {a}-{b}"\nenv = { A = "{a}", C = "c" }\noutputs = ["o{b}.txt"]\n'
    '[parameters]\na = ["p", "q", "r"]\nb = { from = 0.5, to = 2.0, step = 0.25 }\n',
    'command = "lit {{i}} {i}"\n[parameters]\ni = { from = -5, to = 5 }\n',
    'command = "no params"\n',
])
def test_the_per_bag_renderer_renders_every_job_as_render_did(text):
    """The dispatcher's renderer (made once per bag, with fast paths) against the parameter-by-parameter
    definition: the command with every placeholder filled, the env templates, GRIDBOT_PARAM_* and outputs."""
    spec = parse_spec(text, "t.toml", "t")
    fast = spec.renderer()
    for index in range(spec.sweep_size):
        values = spec.params(index)
        env = {k: v.format_map(values) for k, v in spec.env.items()}
        env.update({f"GRIDBOT_PARAM_{k.upper()}": v for k, v in values.items()})
        expected = (spec.command.format_map(values), env, [o.format_map(values) for o in spec.outputs])
        assert fast(index, None) == expected, index


def test_every_wrong_policy_and_the_strategy_are_named_at_once(tmp_path):
    """Found by the walkthrough review of 2026-11-29: a spec with a typo in Rank, a broken
    ReplicationRequirements and an unknown tail was refused one problem at a time, three submissions for three
    fixes."""
    from gridbot.client import load_spec_file

    (tmp_path / "three.toml").write_text('command = "echo {i}"\n[parameters]\ni = [1, 2]\n[policy]\n'
                                         'Rank = "Host.Sped"\nReplicationRequirements = "NumberOfReplicas <"\n'
                                         '[strategy]\ntail = "expertt"\n')
    with pytest.raises(SpecError) as e:
        load_spec_file(tmp_path / "three.toml")
    assert [(p.line, p.message.split(" = ")[0].split(";")[0]) for p in e.value.problems] == [
        (5, "policy Rank"), (6, "policy ReplicationRequirements"), (7, "unknown tail strategy 'expertt' in [strategy]")]


@pytest.mark.parametrize(("key", "says"), [("budget", "'budget' must be a finite number >= 0"),
                                           ("instance_deadline", "a duration must be at most"),
                                           ("bag_deadline", "a bag deadline after submission: a duration must")])
def test_a_whole_number_too_large_for_a_float_is_a_problem_not_an_overflow(key, says):
    """The CLI review: TOML writes whole numbers of any size, and float() of a 401-digit one raised OverflowError."""
    [(line, message, _)] = problems(f'command = "echo"\n{key} = 1{"0" * 400}\n')
    assert line == 2 and says in message and "0" * 100 not in message, message
