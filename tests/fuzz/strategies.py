"""Hypothesis strategies for every request the server takes (issue 12): mostly well-formed messages with
some fields hostile, so the fuzzing reaches the dispatcher and the store rather than stopping at the
decoder, and sometimes plain garbage.

Messages are built as plain dicts, not Structs, so a field can be missing, of the wrong type or out of
range; `encode` turns them into msgpack and may then damage the bytes (invalid UTF-8, truncation).
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

from gridbot.policy.policies import POLICIES

MARK = "\x7fQZ\x7f"
"""A string the encoder writes as 4 bytes that `encode` may replace with invalid UTF-8 of the same length."""
BAD_UTF8 = (b"\xff\xfe\xfd\xfc", b"\xed\xa0\x80a", b"\xc0\xafab", b"a\xe2\x82")

INTS = [0, 1, -1, 2, 7, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63,
        2**64 - 1, -(2**63)]
"""Edges of int32, int64, uint64 and doubles; msgpack carries integers from -2^63 to 2^64-1."""
FLOATS = [0.0, -0.0, 1e-300, 0.5, 1.0, -1.0, 1e9, 1e12, 1e300, 1.7976931348623157e308, float("inf"), float("-inf"),
          float("nan")]
MEGA = "x" * (1 << 20)
STRINGS = ["", " ", "\0", "a\0b", "\n", "a\n", "\r\n", "\t", "\x1b[31mred", "\u202egnp.exe", "é", "日本", "\U0001f600",
           "{", "}", "{}", "{x}", "{0}", "{x!r}", "{x:>10}", "{{x}}", "../../etc", "a/b", "/", ".", "..", "stdout",
           "x" * 64, "x" * 65, "x" * 256, "x" * 100_000, MEGA, "9" * 30, "²", "١٢٣", "-1", "1e999999999", "NaN",
           "Infinity", "-0", "1_000", " 1 ", MARK]

ints = st.one_of(st.sampled_from(INTS), st.integers(-(2**63), 2**64 - 1), st.integers(-5, 100))
floats = st.one_of(st.sampled_from(FLOATS), st.floats(allow_nan=True, allow_infinity=True))
texts = st.one_of(st.sampled_from(STRINGS), st.just(MARK), st.text(max_size=12))
scalars = st.one_of(ints, floats, texts, st.booleans(), st.none(), st.binary(max_size=8))
anything = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=4), scalars, max_size=3))


class F(msgspec.Struct, frozen=True):
    """A field of a message template: a strategy for its good values, one for its hostile ones, and whether
    the message may leave it out (it has a default)."""

    good: Any
    nasty: Any
    optional: bool = True


class Either(msgspec.Struct, frozen=True):
    """One of several templates."""

    options: tuple[Any, ...]


class Many(msgspec.Struct, frozen=True):
    """A list of `size` (a strategy) messages made from `template`."""

    template: Any
    size: Any


@st.composite
def mutated(draw: st.DrawFn, template: Any) -> Any:
    """A message from `template`: every field good but one to three chosen anywhere in it (or none, or
    many), which get hostile values; optional fields sometimes left out, rarely one too many or a required
    one missing. Hostile values one at a time get past the decoder's other checks, to the dispatcher and
    the store (a message hostile all over stops at its first bad field)."""
    shape = _expand(draw, template)
    leaves: list[tuple[Any, Any]] = []
    _leaves(shape, leaves)
    n = draw(st.sampled_from([0, 1, 1, 1, 2, 3, len(leaves)]))
    hostile = set(draw(st.lists(st.integers(0, max(0, len(leaves) - 1)), max_size=n))) if leaves else set()
    for i, (parent, key) in enumerate(leaves):
        f = parent[key]
        if i not in hostile and f.optional and draw(st.integers(0, 9)) == 0:
            del parent[key]
        elif i in hostile:
            parent[key] = draw(f.nasty) if draw(st.integers(0, 7)) else draw(anything)
        else:
            parent[key] = draw(f.good)
    dicts: list[dict[str, Any]] = []
    _dicts(shape, dicts)
    roll = draw(st.integers(0, 59))
    if roll == 0:
        draw(st.sampled_from(dicts))[draw(st.text(max_size=8))] = draw(scalars)
    elif roll == 1:
        d = draw(st.sampled_from(dicts))
        if d:
            del d[draw(st.sampled_from(sorted(d)))]
    return shape


def _expand(draw: st.DrawFn, t: Any) -> Any:
    if isinstance(t, Either):
        return _expand(draw, draw(st.sampled_from(t.options)))
    if isinstance(t, Many):
        return [_expand(draw, t.template) for _ in range(draw(t.size))]
    if isinstance(t, dict):
        return {k: _expand(draw, v) for k, v in t.items()}
    return t


def _leaves(shape: Any, out: list[tuple[Any, Any]]) -> None:
    items = shape.items() if isinstance(shape, dict) else enumerate(shape) if isinstance(shape, list) else ()
    for k, v in items:
        if isinstance(v, F):
            out.append((shape, k))
        else:
            _leaves(v, out)


def _dicts(shape: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(shape, dict):
        out.append(shape)
    for v in shape.values() if isinstance(shape, dict) else shape if isinstance(shape, list) else ():
        _dicts(v, out)


def host_info(host_id: str) -> dict[str, Any]:
    counts = st.integers(1, 64)
    return {
        "host_id": F(st.just(host_id), texts, False),
        "name": F(st.sampled_from(["node1/worker", "h"]), texts, False),
        "platform": F(st.just("Linux-x86_64"), texts),
        "ncpus": F(counts, ints),
        "memory_mb": F(st.integers(0, 1 << 20), ints),
        "slots": F(counts, ints),
        "pool": F(st.just("local"), texts),
        "prefetch": F(st.integers(0, 16), ints),
    }


class Held(msgspec.Struct, frozen=True):
    """Stands for the `index`-th instance the host holds when the message is sent (`bind` fills it in), so
    what hypothesis draws does not depend on the server's state; index -1: the whole list."""

    index: int


def bind(msg: Any, running: list[int]) -> Any:
    """`msg` with every Held replaced by the instance it stands for (or a made-up id if the host has none)."""
    if isinstance(msg, Held):
        if msg.index < 0:
            return list(running)
        return running[msg.index % len(running)] if running else msg.index + 1
    if isinstance(msg, dict):
        return {k: bind(v, running) for k, v in msg.items()}
    if isinstance(msg, list):
        return [bind(v, running) for v in msg]
    return msg


REPORT = {
    "instance_id": F(st.integers(0, 3).map(Held), ints, False),
    "outcome": F(st.sampled_from(["success", "failure", "interrupted"]), texts, False),
    "exit_code": F(st.sampled_from([0, 1, 2, -9, 137, None]), ints),
    "wall_s": F(st.floats(0, 1e5), floats),
    "cpu_s": F(st.floats(0, 1e5), floats),
    "reason": F(st.sampled_from(["", "exit code 1"]), texts),
    "stdout_tail": F(st.sampled_from(["", "out\n"]), texts),
    "stderr_tail": F(st.sampled_from(["", "err\n"]), texts),
    "outputs": F(st.just({}), st.dictionaries(texts, st.binary(max_size=16), max_size=2)),
}


def exchange(host_id: str) -> st.SearchStrategy[Any]:
    """ExchangeRequests as dicts (Held for the host's instances: pass them through `bind`)."""
    return mutated({
        "host": host_info(host_id),
        "want": F(st.integers(0, 8), ints, False),
        "running": F(st.just(Held(-1)), st.lists(ints, max_size=4), False),
        "reports": Many(REPORT, st.integers(0, 4)),
    })


NUMBERS = ["0", "1", "10", "-3", "0.5", "0.1", "1e3", "1E-7", "2.5e1", "1e18", "1e19", "1e-19",
           "123456789012345678901234567890", "1e999999999", "-1e999999999", "NaN", "sNaN", "Infinity", "-Infinity",
           "-0", "1_000", " 1", "٣", "1.", ".5", "+2", "", "x", "0x10"]
numbers = st.one_of(st.sampled_from(NUMBERS), st.integers(-1000, 1000).map(str), st.decimals(allow_nan=True,
                                                                                             allow_infinity=True).map(str))
PARAM_NAMES = ["x", "y", "seed", "_", "a1", "1a", "", "a-b", "x" * 64, "x" * 65, "é", "x\n"]


VALUES = {
    "name": F(st.sampled_from(["x", "y", "seed"]), st.sampled_from(PARAM_NAMES), False),
    "values": F(st.lists(st.sampled_from(["1", "2", "a b", "v"]), min_size=1, max_size=3), st.lists(texts, max_size=3)),
}
RANGE = {
    "name": F(st.sampled_from(["x", "y", "seed"]), st.sampled_from(PARAM_NAMES), False),
    "start": F(st.sampled_from(["1", "0", "-5", "0.1"]), numbers),
    "stop": F(st.sampled_from(["10", "3", "100", "1"]), numbers),
    "step": F(st.sampled_from(["1", "2", "-1", "0.25"]), numbers),
}


COMMANDS = ["true", "echo {x}", "echo {y} {x}", "echo {seed}", "echo {{x}}", "echo {z}", "echo {x", "echo }",
            "echo {0}", "echo {x.y}", "echo {x[0]}", "echo {x!r}", "echo {}", "a\0b", "x" * 200_000, ""]
POLICY_TEXTS = ["1", "0", "-5", "-1", "0.5", "1e400", "true", "false", "undefined", "error", "Host.Slots",
                "Host.Slots - 8", "Host.Slots - 64", "Host.NumCpus * 0", "-Host.Slots", "Host.Nope", "(", ")", "1 +",
                '"text"', "Bag.JobsLeft > 0", "Tail && NumberOfReplicas < 2", "!Host.BlackHole", "x" * 5000, "\0",
                "a\0b", "1; 2", "1 // c", "[a = 1].a", "Host.Pool == \"local\"", "ifThenElse(Host.Slots > 2, -1, 1)",
                "real(\"nan\")", "1.0/0", "-1.0/0", "0/0"]
policy_names = st.one_of(st.just("Concurrency"), st.sampled_from([*POLICIES, "concurrency", "Bogus", "", "\0"]))
"""Concurrency half the time: the policy whose value stalled the whole server (issue 12)."""
policy_texts = st.one_of(st.sampled_from(POLICY_TEXTS), st.text(max_size=20))


def spec(name: str, each_line: bool) -> dict[str, Any]:
    durations = st.sampled_from([60.0, 3600.0, 86400.0])
    command = st.just("") if each_line else st.sampled_from(["echo {x}", "true", "echo {x} {y}"])
    return {
        "name": F(st.just(name), texts, False),
        "command": F(command, st.sampled_from(COMMANDS)),
        "parameters": Many(Either((VALUES, RANGE)), st.integers(0, 0 if each_line else 3)),
        "env": F(st.just({}), st.dictionaries(texts, texts, max_size=2)),
        "inputs": F(st.just([]), st.lists(texts, max_size=2)),
        "outputs": F(st.just([]), st.lists(texts, max_size=2)),
        "max_failures": F(st.integers(1, 5), ints),
        "instance_deadline": F(durations, floats),
        "timeout": F(st.none() | durations, floats),
        "each_line": F(st.just(each_line), st.booleans()),
        "description": F(st.just(""), texts),
        "policy": F(st.just({}), st.dictionaries(policy_names, policy_texts, max_size=2)),
        "memory": F(st.none() | st.just(1 << 30), ints),
        "cpu_time": F(st.none() | durations, floats),
        "max_file_size": F(st.none() | st.just(1 << 20), ints),
        "max_processes": F(st.none() | st.just(64), ints),
    }


def submit(name: str) -> st.SearchStrategy[Any]:
    """SubmitRequests as dicts: a sweep or an each-line bag, with its lines and input files."""
    lines = st.lists(st.sampled_from(["echo a", "true", "echo {x}"]), min_size=1, max_size=3)
    sweep = {"spec": spec(name, False), "lines": F(st.none(), st.lists(texts, max_size=3)),
             "inputs": F(st.just({}), st.dictionaries(texts, st.binary(max_size=8), max_size=2))}
    each = {"spec": spec(name, True), "lines": F(lines, st.none() | st.lists(texts, max_size=3), False)}
    return mutated(Either((sweep, each)))


def retry(name: str) -> st.SearchStrategy[Any]:
    """RetryRequests as dicts: job indices (None: every failed job), or a revision of bag `name`."""
    indices = {"indices": F(st.none() | st.lists(st.integers(0, 1200), max_size=4), st.lists(ints, max_size=3))}
    revision = {"revision": {"spec": spec(name, False), "lines": F(st.none(), st.lists(texts, max_size=2)),
                             "inputs": F(st.just({}), st.dictionaries(texts, st.binary(max_size=8), max_size=2))}}
    return mutated(Either((indices, revision)))


class Damage(msgspec.Struct, frozen=True):
    """What to do to an encoded message: nothing, cut it at a fraction of its length, change one byte, or
    make the marked strings invalid UTF-8 (drawn before the message is encoded, independent of it)."""

    kind: int
    at: float
    byte: int
    bad: bytes

    def __call__(self, msg: Any) -> bytes:
        body = msgspec.msgpack.encode(msg)
        at = min(len(body) - 1, int(self.at * len(body)))
        if self.kind == 0 and body:
            return body[:at]
        if self.kind == 1 and body:
            return body[:at] + bytes([self.byte]) + body[at + 1:]
        return body.replace(MARK.encode(), self.bad) if self.kind < 12 else body


damage = st.builds(Damage, st.integers(0, 19), st.floats(0, 1), st.integers(0, 255), st.sampled_from(BAD_UTF8))
