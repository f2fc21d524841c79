"""Issue 12: fuzzing of specs as users write them (TOML through parse_spec, lines through parse_lines):
every input is either a BagSpec or a SpecError, and what the command line accepts the server accepts."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gridbot.model.spec import TOP_KEYS, BagSpec, SpecError, check_spec, parse_lines, parse_spec
from gridbot.policy.policies import PolicyError, validate_policies
from gridbot.store.memory import MemoryStore
from tests.fuzz import strategies as fs
from tests.fuzz.harness import App
from tests.fuzz.test_fuzz_api import CONFIG

FUZZ = settings(deadline=None, database=None, max_examples=300,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


def toml_string(s: str) -> str:
    """`s` as a TOML basic string (control characters and DEL escaped, as TOML requires)."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(k: str) -> str:
    return k if k and all(c.isascii() and (c.isalnum() or c in "_-") for c in k) else toml_string(k)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + " }"


TEXTS = st.one_of(st.sampled_from([s for s in fs.STRINGS if len(s) < 300_000]), st.text(max_size=10))
SCALARS = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from(fs.INTS), st.sampled_from(fs.FLOATS),
                    st.floats(allow_nan=True, allow_infinity=True), TEXTS, st.booleans(),
                    st.sampled_from(["1s", "10m", "2h", "1d", "0s", "1e9d", "99999999999999999999d", "512K", "2G",
                                     "1e3M", "99999999999999999999T", "0M", "-1"]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3))
NUMBER = st.one_of(st.integers(-20, 20), st.sampled_from([0, 0.5, -0.25, 1e-30, 1e30, 10**20, 2**63, -(2**63)]),
                   st.sampled_from(fs.FLOATS), st.floats(-10, 10), st.integers(-(2**65), 2**65), TEXTS)
RANGE = st.one_of(st.fixed_dictionaries({"from": NUMBER, "to": NUMBER}, optional={"step": NUMBER}),
                  st.dictionaries(st.sampled_from(["from", "to", "step", "form"]), NUMBER, max_size=3))
COMMANDS = st.one_of(st.sampled_from([c for c in fs.COMMANDS if len(c) < 1000] + ["echo {x} {seed}", "x" * 140_000]),
                     TEXTS)


@st.composite
def spec_text(draw: st.DrawFn) -> str:
    """A TOML spec: top-level keys with plausible or hostile values, and the parameters, env and policy
    tables, in a random mix."""
    top: dict[str, Any] = {}
    keys = draw(st.lists(st.sampled_from([*TOP_KEYS, "comand", "x"]), max_size=6, unique=True))
    if draw(st.integers(0, 9)) and "command" not in keys:
        keys.insert(0, "command")
    for key in keys:
        if key in ("parameters", "env", "policy"):
            continue
        top[key] = draw(COMMANDS if key == "command" else
                        st.lists(TEXTS, max_size=3) if key in ("inputs", "outputs") else VALUES)
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in top.items()]
    if draw(st.booleans()):
        lines.append("[parameters]")
        names = st.sampled_from(["x", "y", "seed", "_", "1a", "a-b", "é", "x" * 65, ""])
        for name in draw(st.lists(names, max_size=3, unique=True)):
            value = draw(st.one_of(RANGE, st.lists(SCALARS, max_size=3), SCALARS))
            lines.append(f"{toml_key(name)} = {toml_value(value)}")
    if draw(st.booleans()):
        lines.append("[env]")
        for name in draw(st.lists(st.sampled_from(["A", "B_1", "1X", "a b", "", "X" * 300]), max_size=2, unique=True)):
            lines.append(f"{toml_key(name)} = {toml_value(draw(SCALARS))}")
    if draw(st.booleans()):
        lines.append("[policy]")
        for name in draw(st.lists(fs.policy_names, max_size=2, unique=True)):
            lines.append(f"{toml_key(name)} = {toml_value(draw(st.one_of(fs.policy_texts, SCALARS)))}")
    return "\n".join(lines) + "\n"


def accepted(text: str) -> BagSpec | None:
    """The spec the command line makes of `text` (as `load_spec_file`: parse_spec, then its policies), or None
    if it refuses it, with a SpecError or a PolicyError and nothing else."""
    try:
        spec = parse_spec(text, "fuzz.toml", "fuzz", max_jobs=CONFIG.max_jobs)
        validate_policies(spec.policy, spec.instance_deadline)
    except SpecError as e:
        assert e.problems and all(p.message for p in e.problems)
        return None
    except PolicyError as e:
        assert e.problem
        return None
    return spec


@pytest.fixture(scope="module")
def server() -> Iterator[App]:
    app = App(MemoryStore(), config=CONFIG)
    yield app
    app.close()


def test_toml_specs(server):
    """TOML through parse_spec: a BagSpec or a SpecError; an accepted spec passes the server's own check,
    renders every job, and the server takes it (the same spec through the API: 201)."""
    count = iter(range(10**9))

    @FUZZ
    @given(text=spec_text())
    def run(text: str) -> None:
        spec = accepted(text)
        if spec is None:
            return
        assert check_spec(spec) == [], text
        for index in {0, spec.sweep_size // 2, spec.sweep_size - 1}:
            spec.render(index)
        spec = msgspec.structs.replace(spec, name=f"toml{next(count)}")
        reply = server.submit(spec, inputs={p.rstrip("/").rsplit("/", 1)[-1]: b"x" for p in spec.inputs})
        assert reply.status == 201, (reply.status, reply.message, text)

    run()


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_any_text_is_a_spec_or_a_spec_error(text):
    accepted(text)


LINES = st.sampled_from(["echo a", "", " ", "\0", "x" * 140_000, "\r", "a\x0bb", "\u2028", "é" * 40_000])


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.lists(LINES, max_size=5).map("\n".join)))
def test_each_line_files(text):
    """parse_lines: the commands, each one a line the server takes, or a SpecError."""
    try:
        lines = parse_lines(text, "lines.txt", max_jobs=CONFIG.max_jobs)
    except SpecError:
        return
    assert lines and all(line.strip() for line in lines)
    assert check_spec(BagSpec("lines", each_line=True), lines) == []

