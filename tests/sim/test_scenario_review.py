"""Scenario mistakes a review found crashing or running without a word: each is now a problem with its line
and a fix (or a warning, where the scenario is allowed but surely not meant)."""

from __future__ import annotations

import gzip
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from gridbot.model.spec import SpecError
from gridbot.sim.scenario import Scenario, parse_scenario

POOL = '[pools.c]\nkind = "cluster"\nsize = 2\n'
SWF = "".join(f"{n} {10 * n} 5 {100 + n} 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n" for n in range(1, 200))
"""A small SWF log of 199 completed jobs, long enough that its gzip is more than a header."""


def bag(runtime: str, extra: str = "") -> str:
    return f"{POOL}[bags.b]\njobs = 2\nruntime = {runtime}\n{extra}"


def refused(text: str, tmp_path: Path | None = None) -> str:
    """The problems parse_scenario reports, as the CLI prints them."""
    source = str(tmp_path / "s.toml") if tmp_path else "s.toml"
    with pytest.raises(SpecError) as e:
        parse_scenario(text, source)
    return str(e.value)


def simulate(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "s.toml").write_text(text)
    return subprocess.run([sys.executable, "-m", "gridbot", "simulate", "s.toml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


# 1. Distributions whose mean overflows crashed with OverflowError.

@pytest.mark.parametrize(("runtime", "words"), [
    ('{ dist = "lognormal", mu = 1000, sigma = 1 }', "mu + sigma²/2 is 1000.5"),
    ('{ dist = "lognormal", mu = 1, sigma = 40 }', "mu + sigma²/2 is 801"),
    ('{ dist = "lognormal", mu = 1, sigma = 1e200 }', "mu + sigma²/2 is inf"),
    ('{ dist = "weibull", shape = 0.001, scale = "1h" }', "shape 0.001 is too small"),
    ('{ dist = "lognormal", mu = 30, sigma = 1 }', "at most 1e+09 s"),
])
def test_a_distribution_whose_mean_overflows_is_a_problem_not_a_crash(runtime: str, words: str) -> None:
    message = refused(bag(runtime))
    assert "s.toml:6:" in message and "runtime of bag 'b'" in message and "out of range" in message
    assert words in message, message


def test_a_speed_whose_mean_overflows_is_a_problem_too() -> None:
    message = refused(bag("1").replace("size = 2", 'size = 2\nspeed = { dist = "lognormal", mu = 800, sigma = 1 }'))
    assert "speed of pool 'c'" in message and "keep it at most 709" in message, message


def test_an_overflowing_mean_exits_2_from_the_command_line(tmp_path: Path) -> None:
    p = simulate(bag('{ dist = "weibull", shape = 0.001, scale = "1h" }'), tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "raise shape" in p.stderr


# 2. Compressed trace files cut short or garbled printed "Aborted!" or a traceback.

def broken_logs(tmp_path: Path) -> dict[str, Path]:
    good = gzip.compress(SWF.encode())
    assert len(good) > 120
    logs = {"trunc.swf.gz": good[:60], "garbage.swf.gz": bytes(range(100, 200)),
            "trunc.swf.xz": lzma.compress(SWF.encode())[:60], "garbage.swf.xz": bytes(range(100))}
    for name, data in logs.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in logs}


@pytest.mark.parametrize("name", ["trunc.swf.gz", "garbage.swf.gz", "trunc.swf.xz", "garbage.swf.xz"])
def test_a_cut_or_garbled_compressed_log_is_named(tmp_path: Path, name: str) -> None:
    path = broken_logs(tmp_path)[name]
    kind = "gzip" if name.endswith(".gz") else "xz"
    for text in (bag(f'{{ swf = "{path}" }}'), f'{POOL}[swf_bags.s]\nswf = "{name}"\n'):
        message = refused(text, tmp_path)
        assert f"trace file {str(path)!r} cannot be decompressed" in message, message
        assert f"cut short or is not {kind}-compressed" in message, message


@pytest.mark.parametrize("name", ["trunc.swf.gz", "garbage.swf.gz"])
def test_a_cut_log_exits_2_from_the_command_line(tmp_path: Path, name: str) -> None:
    broken_logs(tmp_path)
    p = simulate(bag(f'{{ swf = "{name}" }}'), tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "Aborted" not in p.stderr, p.stderr
    assert name in p.stderr and "cut short" in p.stderr


# 3. Infinite, NaN and negative times in SWF logs crashed or made bags that never arrive.

@pytest.mark.parametrize(("record", "words"), [
    ("1 0 10 inf 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1", "run time (field 4) of inf"),
    ("1 0 10 nan 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1", "run time (field 4) of nan"),
    ("1 inf 10 50 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1", "submit time (field 2) of inf"),
    ("1 nan 10 50 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1", "submit time (field 2) of nan"),
    ("1 -1e300 10 50 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1", "submit time (field 2) of -1e+300"),
    ("1 1e300 10 50 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1", "submit time (field 2) of 1e+300"),  # audit
    ("1 0 10 50 inf -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1", "holds a field that is not a number"),
])
def test_an_swf_record_with_impossible_times_is_named(tmp_path: Path, record: str, words: str) -> None:
    (tmp_path / "bad.swf").write_text("; a log\n2 0 10 100 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n" + record + "\n")
    for text in (f'{POOL}[swf_bags.s]\nswf = "bad.swf"\n', bag(f'{{ swf = "{tmp_path / "bad.swf"}" }}')):
        message = refused(text, tmp_path)
        assert f"line {record!r}" in message and words in message, message


def test_an_swf_log_out_of_submission_order_is_replayed_in_submission_order(tmp_path: Path) -> None:
    """Audit: bags arrived in file order counted from the first line's submit time, so a log whose job 2 was
    submitted an hour before job 1 made bag s-2 arrive at -3600 s, and its makespan an hour too long."""
    (tmp_path / "uns.swf").write_text("1 3600 10 60 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n"
                                      "2 0 10 60 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n"
                                      "3 1800 10 60 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n")
    sc = parse_scenario(f'{POOL}[swf_bags.s]\nswf = "uns.swf"\n', str(tmp_path / "s.toml"))
    assert [(b.name, b.arrival) for b in sc.bags] == [("s-2", 0.0), ("s-3", 1800.0), ("s-1", 3600.0)]
    sc = parse_scenario(f'{POOL}[swf_bags.s]\nswf = "uns.swf"\nskip = 1\ncount = 1\n', str(tmp_path / "s.toml"))
    assert [(b.name, b.arrival) for b in sc.bags] == [("s-3", 0.0)]  # skip and count go in submission order too


@pytest.mark.parametrize("log", ["NASA-iPSC", "CESNET-wagap"])
def test_the_shipped_logs_replay_their_first_bags_from_time_0(log: str) -> None:
    """The review of 2026-11-29: a cap of 1e9 s on submit times refused CESNET-wagap, whose are Unix times."""
    sc = parse_scenario(f'{POOL}[swf_bags.s]\nswf = "{log}"\ncount = 3\n', "s.toml")
    arrivals = [b.arrival for b in sc.bags]
    assert len(arrivals) == 3 and arrivals[0] == 0.0 and arrivals == sorted(arrivals), arrivals


def test_an_infinite_run_time_exits_2_from_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "inf.swf").write_text("1 0 10 inf 4 -1 -1 4 -1 -1 1 1 1 -1 1 -1 -1 -1\n")
    p = simulate(f'{POOL}[swf_bags.s]\nswf = "inf.swf"\n', tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "run time (field 4) of inf" in p.stderr


@pytest.mark.parametrize("value", ["inf", "0", "0.0", "-1", "-inf", "nan"])
def test_a_time_scale_not_above_zero_or_infinite_is_refused(value: str) -> None:
    """`time_scale = 0` was accepted (the bad-input hunt): every bag of the log then arrived at time 0, which
    the key does not mean (it scales the gaps between submissions), and the message for inf said '0 or more'."""
    message = refused(f'{POOL}[swf_bags.s]\nswf = "NASA-iPSC"\ncount = 2\ntime_scale = {value}\n')
    assert "swf_bags.s.time_scale: must be a number above 0, finite, not" in message, message
    assert "time_scale = 0.01" in message


# 4. A bag of a trillion jobs died of MemoryError; a runtime of 1e300 s ran a year without a word.

def test_a_bag_of_more_jobs_than_a_spec_takes_is_refused() -> None:
    message = refused(bag("10").replace("jobs = 2", "jobs = 1000000000000"))
    assert "s.toml:5: bag 'b' has 1,000,000,000,000 jobs; a bag takes at most 100,000,000" in message, message
    message = refused(bag("10", "copies = 1000000000000\n"))  # (and not a loop over its copies)
    assert "copies of 2 jobs" in message and "copies = 50,000,000 at most" in message, message
    message = refused(f'{POOL}[swf_bags.s]\nswf = "NASA-iPSC"\nmax_jobs = 1000000000000\n')
    assert "max_jobs: must be a whole number of at most 100,000,000" in message, message


@pytest.mark.parametrize("text", [bag("1e300"), bag('"1e12d"'), bag('{ dist = "exponential", mean = 1e300 }'),
                                  bag("1", "arrival = 1e300\n"), f'[simulation]\nhorizon = "inf"\n{bag("1")}'])
def test_durations_longer_than_a_spec_takes_are_refused(text: str) -> None:
    message = refused(text)
    assert "a duration must be at most 1,000,000,000 s (about 31 years)" in message, message


# 5. A pool that never holds a host simulated a year for nothing.

def warnings(text: str, tmp_path: Path) -> list[str]:
    sc: Scenario = parse_scenario(text, str(tmp_path / "s.toml"))
    return [w.message for w in sc.warnings]


@pytest.mark.parametrize("size", ["0", "[[0, 0]]", '[[0, 0], ["6h", 0]]', '{ min = 0, max = 0, every = "1h" }',
                                  '{ trace = "zero.csv" }'])
def test_a_pool_of_size_zero_at_all_times_is_warned_of(tmp_path: Path, size: str) -> None:
    (tmp_path / "zero.csv").write_text("0,0\n")
    said = warnings(bag("10").replace("size = 2", f"size = {size}"), tmp_path)
    assert any("pool 'c' has a size of 0 at all times" in w for w in said), said


@pytest.mark.parametrize("size", ['[[0, 0], ["6h", 10]]', '{ min = 0, max = 5, every = "1h" }', "3"])
def test_a_pool_that_starts_empty_and_grows_is_not_warned_of(tmp_path: Path, size: str) -> None:
    assert warnings(bag("10").replace("size = 2", f"size = {size}"), tmp_path) == []


# 6. A bag arriving after the horizon was reported "not arrived" without a word.

def test_a_bag_arriving_after_the_horizon_is_warned_of(tmp_path: Path) -> None:
    [said] = warnings(bag("10", 'arrival = "400d"\n'), tmp_path)
    assert "bag 'b': it arrives at 400 d, after the simulation's horizon (365 d)" in said, said
    sc = parse_scenario(bag("10", 'arrival = "400d"\n'), "s.toml")
    assert sc.warnings[0].line == 7 and 'horizon = "401d"' in sc.warnings[0].hint
    assert warnings('[simulation]\nhorizon = "500d"\n' + bag("10", 'arrival = "400d"\n'), tmp_path) == []


def test_a_bag_arriving_at_the_horizon_itself_is_warned_of(tmp_path: Path) -> None:
    """Found by the bad-input hunt: a bag arriving exactly at the horizon got no warning (only one after it
    did), and the run reported it "active" having run nothing of it."""
    text = '[simulation]\nhorizon = "1h"\n' + bag("10", 'arrival = "1h"\n')
    [said] = warnings(text, tmp_path)
    assert "bag 'b': it arrives at 1 h, at the simulation's horizon: the run stops as it arrives" in said, said
    assert '"active" with nothing run' in said
    assert 'horizon = "2d"' in parse_scenario(text, "s.toml").warnings[0].hint
    assert warnings(text.replace('arrival = "1h"', 'arrival = "59m"'), tmp_path) == []


def test_swf_bags_arriving_at_or_after_the_horizon_are_warned_of_as_such(tmp_path: Path) -> None:
    (tmp_path / "log.swf").write_text(SWF)
    # the log's bags arrive 10 s apart, from 0: at 90, 100 and 110 s, three of them at or after 90 s
    text = f'[simulation]\nhorizon = "90s"\n{POOL}[swf_bags.s]\nswf = "log.swf"\ncount = 12\n'
    said = warnings(text, tmp_path)
    assert any("swf_bags 's': 3 of its 12 bags arrive at or after the simulation's horizon (1.5 min)" in w
               and "(those at the horizon itself \"active\", with nothing run)" in w for w in said), said


def test_swf_bags_arriving_after_the_horizon_are_warned_of(tmp_path: Path) -> None:
    (tmp_path / "log.swf").write_text(SWF)
    text = f'[simulation]\nhorizon = "10m"\n{POOL}[swf_bags.s]\nswf = "log.swf"\ncount = 100\n'
    said = warnings(text, tmp_path)
    assert any("swf_bags 's': 40 of its 100 bags arrive at or after the simulation's horizon (10 min)" in w
               for w in said), said


# 7. A whole number too large for a float (TOML takes any) crashed with OverflowError (the CLI review).

BIG = "1" + "0" * 400


@pytest.mark.parametrize(("text", "line", "words"), [
    (bag(BIG), 6, "a duration must be at most 1,000,000,000 s"),
    (bag(f'{{ dist = "lognormal", mu = {BIG}, sigma = 1 }}'), 6, "'mu': 1000"),
    (bag("10").replace("size = 2", f"size = 2\nspeed = {BIG}"), 4, "is not a finite number"),
    (bag("10").replace("size = 2", f"size = 2\npreemption = {BIG}"), 4, "must be a rate"),
    (bag("10", f"budget = {BIG}\n"), 7, "'budget' must be a finite number >= 0"),
    (bag("10").replace("size = 2", f"size = 2\nprice_per_cpu_hour = {BIG}"), 4, "must be a number of 0 or more"),
    (f"[simulation]\ntick = {BIG}\n{bag('10')}", 2, "a duration must be at most"),
])
def test_a_huge_whole_number_is_refused_with_its_line_and_cut_short(text: str, line: int, words: str) -> None:
    message = refused(text)
    assert f"s.toml:{line}:" in message and words in message, message
    assert "0" * 100 not in message, "the message repeats all 401 digits"


def test_a_huge_whole_number_exits_2_from_simulate_and_plan(tmp_path: Path) -> None:
    text = bag("10", f"budget = {BIG}\n").replace('kind = "cluster"', 'kind = "grid"')
    p = simulate(text, tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "s.toml:7:" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "gridbot", "plan", "--scenario", "s.toml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "s.toml:7:" in p.stderr, p.stderr


# 8. A CSV field over the csv module's limit, and a file not UTF-8, crashed or named neither file nor fix.

@pytest.mark.parametrize(("kind", "size", "row"), [
    ("cluster", "trace", "0," + "1" * 140_000),
    ("community", "hosts", "h," + "x" * 140_000 + ",1"),
])
def test_a_csv_field_too_long_is_named_with_its_file_and_line(tmp_path: Path, kind: str, size: str, row: str) -> None:
    (tmp_path / "t.csv").write_text(f"# a trace\n{row}\n")
    text = bag("10").replace('"cluster"', f'"{kind}"').replace("size = 2", f'size = {{ {size} = "t.csv" }}')
    message = refused(text, tmp_path)
    assert f"{tmp_path / 't.csv'}:2: not a CSV line" in message and "field larger than field limit" in message
    assert "name the right file" in message, message


@pytest.mark.parametrize(("kind", "size", "what"), [("cluster", "trace", "size trace"),
                                                    ("community", "hosts", "host trace")])
def test_a_trace_not_utf8_is_named_as_such(tmp_path: Path, kind: str, size: str, what: str) -> None:
    (tmp_path / "bin.csv").write_bytes(bytes(range(128, 256)) * 4)
    text = bag("10").replace('"cluster"', f'"{kind}"').replace("size = 2", f'size = {{ {size} = "bin.csv" }}')
    message = refused(text, tmp_path)
    assert f"{tmp_path / 'bin.csv'} is not a UTF-8 text file (invalid start byte at byte 0): a {what}" in message
    assert "save it as UTF-8" in message, message
    p = simulate(text, tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "is not a UTF-8 text file" in p.stderr, p.stderr


# 9. A bag's policies stopped at the first problem; a spec's [policy] names every one.

def test_every_wrong_policy_of_a_bag_is_named_at_once() -> None:
    message = refused(bag("10", '[bags.b.policy]\nJobRequirements = "Host.Pool =="\nDeadline = "0"\nBogus = "1"\n'))
    for line, policy in ((8, "JobRequirements"), (9, "Deadline"), (10, "Bogus")):
        assert f"s.toml:{line}: bag 'b': policy {policy} = " in message, message


# 10. A tiny tick, overlay_interval or sample was accepted, and the run hung or grew past a gigabyte.

@pytest.mark.parametrize(("key", "value", "steps", "fix"), [
    ("sample", "1e-5", "720,000,000 steps to the horizon (2 h), over the simulator's 1,000,000", "sample = 0.008"),
    ("tick", "1e-6", "7,200,000,000 steps to the horizon (2 h), over the simulator's 10,000,000", "tick = 0.001"),
    ("overlay_interval", "1e-6", "7,200,000,000 steps", "overlay_interval = 0.001"),
])
def test_a_period_far_too_short_for_the_horizon_is_refused(key: str, value: str, steps: str, fix: str) -> None:
    message = refused(f'[simulation]\nhorizon = "2h"\n{key} = {value}\n{bag("10")}')
    assert f"s.toml:3: simulation.{key} = " in message and steps in message, message
    assert f"{fix} or more, or a shorter horizon" in message, message


@pytest.mark.parametrize(("text", "steps"), [
    ('horizon = "2h"\ntick = 1e-4', "72,000,000 steps to the horizon (2 h)"),
    ('tick = "1s"', "31,536,000 steps to the horizon (365 d)"),  # the default horizon: fine if the bags end
    ('horizon = "11315d"', "16,293,600 steps"),  # 31 years, the default tick of a minute
])
def test_a_period_short_for_the_horizon_is_warned_of_not_refused(text: str, steps: str) -> None:
    """A run stops when its bags have all ended, so a short tick is refused only where no run could end (the
    review of the first version of this check: tick = "1s" with the default horizon of a year was refused)."""
    sc = parse_scenario(f'[simulation]\n{text}\n{bag("10")}', "s.toml")
    said = [w.message for w in sc.warnings]
    assert any(steps in w and "a run whose bags do not all end long before the horizon takes them all" in w
               for w in said), said


@pytest.mark.parametrize("value", ["0", '"abc"', "-5", "true", "1" + "0" * 400])
def test_a_bad_sample_is_refused_not_divided_by(value: str) -> None:
    """The first version of the check above divided the horizon by the default a bad `sample` fell back to (0):
    a ZeroDivisionError out of the parser for every bad sample (review of 2026-12-07)."""
    assert "s.toml:2: " in refused(f'[simulation]\nsample = {value}\n{bag("10")}')


def test_a_period_that_fits_the_horizon_is_taken() -> None:
    sc = parse_scenario(f'[simulation]\nhorizon = "2h"\ntick = 0.001\nsample = 0.008\n{bag("10")}', "s.toml")
    assert (sc.tick, sc.sample) == (0.001, 0.008) and not sc.warnings


# 11. `runtime = { swf = "log.swf" }` was found from the current folder, `[swf_bags]` logs from the scenario's.

def test_an_swf_distribution_is_found_from_the_scenarios_folder(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "log.swf").write_text(SWF)
    sc = parse_scenario(bag('{ swf = "log.swf" }'), str(tmp_path / "sub" / "s.toml"))
    assert sc.bags[0].runtime.describe == "runtimes of SWF log log.swf (199 values)"
    message = refused(bag('{ swf = "other.swf" }'), tmp_path)
    assert f"no SWF log 'other.swf': not one shipped with gridbot (NASA-iPSC (NASA-iPSC-1993-3.1-cln.swf.gz), " \
           f"CESNET-wagap (wagap-2013.swf.gz)), nor a file in the " \
           f"scenario's folder ({tmp_path})" in message and "give its path from the scenario's folder" in message


@pytest.mark.parametrize("name", ["NASA-iPSC", "NASA-iPSC-1993-3.1-cln.swf.gz"])
def test_a_shipped_swf_log_is_found_by_its_short_name_or_its_file_name(tmp_path: Path, name: str) -> None:
    """The first version of the search above took a shipped log's file name (experiments/hierarchy/run.py and
    traces/README.md use them) for a path, found no such file, and refused it as 'not one shipped' (review)."""
    sc = parse_scenario(bag(f'{{ swf = "{name}" }}'), str(tmp_path / "s.toml"))
    assert sc.bags[0].runtime.describe.startswith(f"runtimes of SWF log {name} ("), sc.bags[0].runtime.describe


@pytest.mark.parametrize("value", ['"\u0661\u0660m"', '"1_0m"'])
def test_a_scenario_duration_takes_ascii_digits_only(value: str) -> None:
    """float() reads any script's digits and underscores: "١٠m" was 10 minutes in a scenario, while a spec's
    durations refused it (review of 2026-12-07)."""
    assert "is not a duration" in refused(bag(value))
