"""Issue 12, each item reproduced: bad input that was accepted, stalled the server, or answered 5xx. The server
checks everything itself, with the command line's code, answers 4xx with the problem and the fix, and a
refused request changes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gridbot.cli import render
from gridbot.core.changes import BagCounts
from gridbot.model.records import HostInfo
from gridbot.model.spec import (
    HARD_MAX_JOBS,
    MAX_COMMAND_BYTES,
    BagSpec,
    Parameter,
    SpecError,
    check_spec,
    parse_lines,
    parse_spec,
)
from gridbot.policy.policies import PolicyError, compile_policies, validate_policies
from gridbot.protocol import BagInfo, ExchangeRequest, ExchangeResponse, JobInfo
from gridbot.server.service import Service, ServiceConfig
from gridbot.store.base import Store
from gridbot.store.memory import MemoryStore
from gridbot.store.sql import PostgresStore, SQLiteStore
from tests.fuzz.harness import MSGPACK, App, Reply
from tests.fuzz.test_fuzz_api import BASE, CONFIG

SWEEP = BagSpec("sweep", "echo {x}", [Parameter("x", start="1", stop="100", step="1")])


def make_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    store: Store = (MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "g.db") if kind == "sqlite"
                    else PostgresStore(request.getfixturevalue("pg_url")))
    store.migrate()
    return store


@pytest.fixture
def app(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[App]:
    a = App(make_store("sqlite", tmp_path, request), config=CONFIG)
    yield a
    a.close()
    a.service.store.close()


def refused(app: App, method: str, path: str, body: bytes | None = None, status: int = 400, **kw: Any) -> str:
    """Send a request that must be refused with `status` and change nothing; its message."""
    before = app.state()
    reply = app.call(method, path, body, **kw)
    assert reply.status == status, (reply.status, reply.body[:500])
    assert reply.message and app.state() == before
    return reply.message


def submit_refused(app: App, spec: BagSpec, lines: list[str] | None = None) -> str:
    from gridbot.protocol import SubmitRequest

    return refused(app, "POST", "/v1/bags", msgspec.msgpack.encode(SubmitRequest(spec, lines)))


# -- Concurrency of 0 or less ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["-5", "0", "0.5", "ifThenElse(true, -1, 4)"])
def test_a_constant_concurrency_below_one_is_refused_in_a_spec_and_live(app, text):
    message = submit_refused(app, msgspec.structs.replace(SWEEP, policy={"Concurrency": text}))
    assert "Concurrency" in message and "on every host" in message and "at least 1" in message
    assert app.submit(SWEEP).status == 201
    message = refused(app, "POST", "/v1/bags/sweep/policy", json.dumps({"name": "Concurrency", "text": text}).encode(),
                      content_type="application/json")
    assert "Concurrency" in message and "at least 1" in message


@pytest.mark.parametrize(("name", "text", "fix"), [
    ("Deadline", "1e309", "above 0"), ("Deadline", "-1", "above 0"), ("Deadline", "0", "above 0"),
    ("Rank", "1e309", "finite"), ("Rank", "-1e309", "finite"), ("Deadline", "real(\"nan\")", "above 0")])
def test_a_constant_rank_or_deadline_the_server_would_ignore_is_refused(app, name, text, fix):
    """Found by the API review of 2026-11-27: `Deadline = 1e309` or `-1` and `Rank = 1e309` were accepted, and
    every decision then counted the default instead, said only in the bag's diagnostics."""
    message = submit_refused(app, msgspec.structs.replace(SWEEP, policy={name: text}))
    assert name in message and "on every host" in message and fix in message, message
    assert app.submit(SWEEP).status == 201
    message = refused(app, "POST", "/v1/bags/sweep/policy", json.dumps({"name": name, "text": text}).encode(),
                      content_type="application/json")
    assert name in message and fix in message
    ok = {"Deadline": "600", "Rank": "-5"}[name]
    assert app.call("POST", "/v1/bags/sweep/policy", json.dumps({"name": name, "text": ok}).encode(),
                    content_type="application/json").status == 200, "a sensible constant still goes"


def test_the_command_line_refuses_it_with_the_same_code(tmp_path):
    with pytest.raises(PolicyError, match="on every host"):
        validate_policies({"Concurrency": "-5"}, 3600.0)
    from gridbot.client import GridbotError, with_policies

    with pytest.raises(GridbotError, match="at least 1"):
        with_policies(SWEEP, ["Concurrency=0"])


def test_a_concurrency_below_one_on_some_hosts_is_a_diagnostic_and_stalls_no_other_bag(app):
    """`Host.Slots - 8` is -7 on a host of one slot: that bag gets none of it, and says why; another bag,
    ranked lower, is still served there (the highest-ranked bag's 0 used to bound every bag to 0)."""
    policy = {"Concurrency": "Host.Slots - 8", "Rank": "10"}
    assert app.submit(msgspec.structs.replace(SWEEP, name="greedy", policy=policy)).status == 201
    assert app.submit(BASE).status == 201
    got = app.exchange(4, [])
    bags = {a.bag_name for a in got.assignments}
    assert bags == {"base"} and len(got.assignments) == 2  # two per slot, by the default Concurrency of base
    info = msgspec.json.decode(app.call("GET", "/v1/bags/greedy").body, type=BagInfo)
    assert any("Concurrency evaluated to -7 (less than one instance)" in d and "Host.Slots - 8" in d
               for d in info.diagnostics), info.diagnostics


def test_a_bag_stored_with_a_constant_concurrency_of_zero_still_loads_and_stalls_nothing(tmp_path):
    """A bag stored before the check (its policies are compiled, not validated, when the server starts)."""
    store = SQLiteStore(tmp_path / "g.db")
    store.migrate()
    store.create_bag(msgspec.structs.replace(SWEEP, name="old", policy={"Concurrency": "0", "Rank": "5"}), None, {},
                     1.0, "someone")
    compile_policies({"Concurrency": "0"}, 3600.0)  # what restoring it does: no error
    app = App(store, config=CONFIG)
    try:
        assert app.submit(BASE).status == 201
        assert {a.bag_name for a in app.exchange(2, []).assignments} == {"base"}
        assert json.loads(app.call("GET", "/v1/bags/old/policy", token=app.access.admin).body)["Concurrency"] == "0"
    finally:
        app.close()


# -- specs the server took without checking ------------------------------------------------------------


@pytest.mark.parametrize(("spec", "needle"), [
    (BagSpec("ph", "echo {y}", [Parameter("x", values=["1"])]), "placeholder {y} in 'command' names no parameter"),
    (BagSpec("ph", "echo {x}"), "placeholder {x} in 'command' names no parameter"),
    (BagSpec("ph", "true", env={"A": "{nope}"}), "placeholder {nope} in 'env'"),
    (BagSpec("ph", "echo {x!r}", [Parameter("x", values=["1"])]), "is not a placeholder"),
    (BagSpec("st", "echo {x}", [Parameter("x", start="1", stop="10", step="0")]), "has step 0"),
    (BagSpec("st", "echo {x}", [Parameter("x", start="1", stop="10", step="NaN")]), "must be a number"),
    (BagSpec("st", "echo {x}", [Parameter("x", start="1", stop="Infinity", step="1")]), "must be a number"),
    (BagSpec("st", "echo {x}", [Parameter("x", start="0", stop="1e999999999", step="1")]), "at most 1e18"),
    (BagSpec("st", "echo {x}", [Parameter("x", start="10", stop="1", step="1")]), "is empty"),
    (BagSpec("st", "echo {x}", [Parameter("x")]), "either values or a range"),
    (BagSpec("st", "echo {x}", [Parameter("x", values=[])]), "has no values"),
    (BagSpec("st", "echo {x}", [Parameter("x", values=["1"]), Parameter("x", values=["2"])]), "defined twice"),
    (BagSpec("st", "echo {a_b}", [Parameter("a-b", values=["1"])]), "parameter name 'a-b' is not allowed"),
    (BagSpec("env", "true", env={"1X": "v"}), "not a variable name"),
    (BagSpec("mf", "true", max_failures=0), "'max_failures' must be a whole number from 1"),
    (BagSpec("d", "true", instance_deadline=float("nan")), "'instance_deadline': a duration must be positive"),
    (BagSpec("d", "true", timeout=float("inf")), "'timeout': a duration must be at most"),
    (BagSpec("d", "true", timeout=-1.0), "'timeout': a duration must be positive"),
    (BagSpec("lim", "true", memory=0), "'memory': a size must be positive"),
    (BagSpec("lim", "true", memory=1000), "less than 1,048,576"),
    (BagSpec("lim", "true", cpu_time=float("nan")), "'cpu_time'"),
    (BagSpec("lim", "true", max_file_size=-1), "'max_file_size'"),
    (BagSpec("lim", "true", max_processes=0), "'max_processes'"),
    (BagSpec("lim", "true", max_file_size=2**62), "at most 1 EiB"),
])
def test_a_spec_the_command_line_would_refuse_is_refused_by_the_server(app, spec, needle):
    message = submit_refused(app, spec)
    assert needle in message, message
    assert check_spec(spec) and any(needle in p for p in check_spec(spec))


@pytest.mark.parametrize("name", ["", "../../etc", "a/b", "x" * 100_000, "sweep\n", "-x", ".hidden", "a b", "é"])
def test_bag_names_are_checked_by_the_server(app, name):
    message = submit_refused(app, msgspec.structs.replace(SWEEP, name=name))
    assert "is not allowed" in message and "use 1-64 letters" in message and len(message) < 500


@pytest.mark.parametrize("name", ["5", "0042"])
def test_a_bag_name_of_digits_only_is_refused_everywhere(app, tmp_path, name):
    """Found by the API review of 2026-11-27: a bag named "5" was accepted, could never be reached by its name,
    and `DELETE /v1/bags/5` deleted the bag whose id is 5."""
    assert app.submit(SWEEP).status == 201
    message = submit_refused(app, msgspec.structs.replace(SWEEP, name=name))
    assert "only of digits" in message and f"run-{name}" in message
    with pytest.raises(SpecError, match="only of digits"):
        parse_spec(f'name = "{name}"\ncommand = "true"\n', "sweep.toml", "sweep")
    lines = tmp_path / f"{name}.txt"
    lines.write_text("true\n")
    proc = subprocess.run([sys.executable, "-m", "gridbot", "run", "--each-line", str(lines)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "only of digits" in proc.stderr and "--name" in proc.stderr, proc
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("toml", "needle"), [
    ('command = "echo {x} {X}"\n[parameters]\nx = ["a"]\nX = ["b"]\n', "differ only in case"),
    ('command = "true"\n[env]\nGRIDBOT_RUN = "mine"\n', "GRIDBOT_RUN is gridbot's own"),
    ('command = "true"\n[env]\nGRIDBOT_PARAM_X = "1"\n', "GRIDBOT_PARAM_X is gridbot's own"),
    ('command = ""\n', "the command is empty"), ('command = "   "\n', "the command is empty"),
    ('command = "touch {x}"\noutputs = ["{x}"]\n[parameters]\nx = ["ok", "a/../b"]\n', "with x = 'a/../b'"),
    ('command = "true"\noutputs = ["out-{x}/{y}"]\n[parameters]\nx = ["a"]\ny = ["r.txt", ".."]\n',
     "with y = '..'"),
])
def test_specs_the_review_found_accepted_are_refused_by_the_command_line_and_the_server(app, toml, needle):
    """Found by the command-line review of 2026-11-27: parameters x and X both became GRIDBOT_PARAM_X (one
    lost); [env] could set the worker's own variables (GRIDBOT_RUN hid the job from its memory limit); an
    empty command made every job "succeed" having run nothing; an output named by a parameter whose value
    leaves the job's folder was accepted, and those jobs failed at their end."""
    with pytest.raises(SpecError) as e:
        parse_spec(toml, "bad.toml", "bad")
    assert needle in str(e.value), str(e.value)
    spec = msgspec.json.decode(msgspec.json.encode(_spec_of(toml)), type=BagSpec)
    assert needle in submit_refused(app, spec)


def _spec_of(toml: str) -> BagSpec:
    """The BagSpec a TOML spec would make if its checks let it through (a client that skipped them)."""
    import tomllib

    data = tomllib.loads(toml)
    params = [Parameter(k, values=[str(v) for v in vs]) for k, vs in data.get("parameters", {}).items()]
    return BagSpec("bad", data["command"], params, env=data.get("env", {}), outputs=data.get("outputs", []))


def test_an_each_line_file_is_split_at_line_feeds_only():
    """Found by the command-line review: splitlines() also split at \\x0b, \\x0c, \\x1c-\\x1e, \\x85 and
    \\u2028, so one line of a file became several broken commands."""
    text = 'printf "a\x1cb" ; echo c\x0becho d\nsecond\r\n\u2028third\rfourth\n'
    assert parse_lines(text, "c.txt") == ['printf "a\x1cb" ; echo c\x0becho d', "second", "third", "fourth"]


def test_a_spec_and_its_toml_are_refused_with_the_same_words(app):
    """The server's check and the TOML validator share their code: the same problem, the same message."""
    text = 'name = "s"\ncommand = "echo {y}"\n[parameters]\nx = { from = 1, to = 10, step = 0 }\n'
    with pytest.raises(SpecError) as info:
        parse_spec(text, "s.toml", "s")
    toml = {p.message for p in info.value.problems}
    api = submit_refused(app, BagSpec("s", "echo {y}", [Parameter("x", start="1", stop="10", step="0")]))
    assert "range 'x' has step 0" in toml and "range 'x' has step 0" in api


# -- decoding -----------------------------------------------------------------------------------------


def _with_bad_utf8(msg: Any) -> bytes:
    return msgspec.msgpack.encode(msg).replace(b"ZQZQ", b"\xff\xfe\xed\xa0")


def test_invalid_utf8_in_a_msgpack_string_is_a_400(app):
    assert app.submit(SWEEP).status == 201
    body = _with_bad_utf8(ExchangeRequest(HostInfo(app.host_id, "ZQZQ"), 1, []))
    assert "not valid UTF-8" in refused(app, "POST", "/v1/exchange", body, token=app.credential)
    spec = _with_bad_utf8({"spec": {"name": "s", "command": "echo ZQZQ"}})
    assert "not valid UTF-8" in refused(app, "POST", "/v1/bags", spec)
    assert "not valid UTF-8" in refused(app, "POST", "/v1/register", _with_bad_utf8({"name": "ZQZQ"}),
                                        token=app.access.workers["local"])


def test_json_sent_where_msgpack_is_taken_is_a_400_that_says_so(app):
    """Found by the API review of 2026-11-27: a JSON spec sent to POST /v1/bags got "Expected `object`, got
    `int`" (a `{` is msgpack's 123) and no word of msgpack."""
    message = refused(app, "POST", "/v1/bags", b'{"spec": {"name": "j", "command": "true"}}',
                      content_type="application/json")
    assert "looks like JSON" in message and "application/msgpack" in message


def test_json_that_is_not_json_is_a_400(app):
    assert app.submit(SWEEP).status == 201
    for body in (b'{"name": "Rank", "text": "\\ud800"}', b"\xff", b'{"name": 1}', b""):
        refused(app, "POST", "/v1/bags/sweep/policy", body, content_type="application/json")


@pytest.mark.parametrize(("path", "body", "at"), [
    ("/v1/bags/sweep/policy", b'{"name": "Rank", "text": "\\ud800"}', 26),
    ("/v1/bags/sweep/policy", b'{"name": "Rank", "text": "\\ud800", "x": "1"}', 26),
    ("/v1/bags/sweep/policy", b'{"name": "Rank", "text": "a\\udc00b"}', 27),
    ("/v1/bags/sweep/qos", b'{"budget": 5, "bag_deadline": "\\udbff\\n"}', 31),
    ("/v1/bags/sweep/strategy", b'{"tail": "\\ud83d\\ud83d\\ude00"}', 10)])
def test_a_lone_surrogate_in_a_json_string_is_named(app, path, body, at):
    """Found by the bad-input hunt: a JSON string holding "\ud800" (half of a UTF-16 pair, which no character
    is) was 'Input data was truncated' at the end of a body, or 'unexpected end of hex escape'."""
    assert app.submit(SWEEP).status == 201
    message = refused(app, "POST", path, body, content_type="application/json")
    assert "the JSON holds an invalid string" in message and f"at byte {at} is a lone UTF-16 surrogate" in message, \
        message
    assert "truncated" not in message


def test_an_escaped_backslash_or_a_whole_pair_is_no_lone_surrogate(app):
    assert app.submit(SWEEP).status == 201
    for text in ("\\\\ud800", "\\ud83d\\ude00"):
        body = b'{"name": "Rank", "text": "size(\\"' + text.encode() + b'\\")"}'
        assert app.call("POST", "/v1/bags/sweep/policy", body, content_type="application/json").status == 200
    message = refused(app, "POST", "/v1/bags/sweep/policy", b'{"name": ,"text": "\\ud800"}',
                      content_type="application/json")
    assert "not a valid JSON message" in message and "surrogate" not in message, "the first error is named"


def test_a_body_nested_too_deeply_is_a_400_on_every_route_that_reads_one(app, caplog):
    """Found by the API review of 2026-11-27: a body of 2 KB nesting 1,000 lists made msgspec raise
    RecursionError, answered 500 with a traceback in the log."""
    assert app.submit(SWEEP).status == 201
    # (a request's unknown field is refused before its value is read, since 2026-11-29)
    deep_json = b'{"name": "Rank", "text": "1", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert "unknown field `x`" in refused(app, "POST", "/v1/bags/sweep/policy", deep_json,
                                          content_type="application/json")
    deep_msgpack = b"\x82\xa4spec\x81\xa4name\xa2zz\xa1x" + b"\x91" * 2000 + b"\xc0"
    assert "unknown field `x`" in refused(app, "POST", "/v1/bags", deep_msgpack)
    for path, token, needle in (("/v1/exchange", app.credential, "nested too deeply"),
                                ("/v1/register", app.access.workers["local"], "unknown field `x`")):
        assert needle in refused(app, "POST", path, b"\x81\xa1x" + b"\x91" * 2000 + b"\xc0", token=token)
    assert "internal error" not in caplog.text


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_body_that_does_not_decompress_is_a_400(app, caplog, encoding):
    """Found by the API review of 2026-11-27: garbage under `Content-Encoding: gzip` made aiohttp raise
    while the handler read the body, answered 500 with a traceback (br and zstd were already 400s)."""
    assert app.submit(SWEEP).status == 201
    message = refused(app, "POST", "/v1/bags", b"garbage", headers={"Content-Encoding": encoding})
    assert "the body cannot be read" in message and "Content-Encoding" in message
    refused(app, "POST", "/v1/bags/sweep/policy", b"garbage", content_type="application/json",
            headers={"Content-Encoding": encoding})
    assert "internal error" not in caplog.text
    import gzip
    import zlib

    body = msgspec.json.encode({"name": "Rank", "text": "2"})
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    assert app.call("POST", "/v1/bags/sweep/policy", packed, content_type="application/json",
                    headers={"Content-Encoding": encoding}).status == 200  # a good one still reads


def test_a_malformed_request_is_one_line_in_the_log_not_a_traceback(app, caplog):
    """aiohttp answers a Content-Encoding it cannot decode (br, zstd) or a body that does not decompress with
    400, and logged each at ERROR with a traceback (twice for the body): any client could fill the log."""
    import logging

    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    for encoding in ("br", "zstd", "gzip"):
        assert app.call("POST", "/v1/bags", b"garbage", headers={"Content-Encoding": encoding}).status == 400
    mine = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert mine and not [r for r in mine if r.exc_info or r.levelno >= logging.ERROR], \
        [(r.levelname, r.getMessage()) for r in mine]
    said = "\n".join(r.getMessage() for r in mine)
    assert "a malformed request, answered 400" in said and "br" in said and "zstd" in said, said
    assert "Traceback" not in caplog.text


def test_a_timeout_longer_than_the_instance_deadline_is_accepted_and_said_by_the_bags_diagnostics(app):
    """Found by the bad-input hunt: the server gives such an instance up at its deadline, and sends its job
    again, before the job's timeout could fire; it said nothing of it."""
    spec = msgspec.structs.replace(SWEEP, timeout=2 * 86400.0)
    assert app.submit(spec).status == 201
    info = msgspec.json.decode(app.call("GET", "/v1/bags/sweep").body, type=BagInfo)
    assert any(d.startswith("its timeout (172800 s) is longer than its instance_deadline (86400 s)")
               for d in info.diagnostics), info.diagnostics


@pytest.mark.parametrize(("at", "needle"), [(1.0, "has passed"), (time.time() - 60, "has passed"),
                                            (-1e300, "from 1970"), (1e300, "from 1970"), (0.0, "from 1970")])
def test_a_bag_deadline_already_past_or_out_of_time_is_refused_at_submission(app, at, needle):
    """Found by the API review of 2026-11-27: a bag submitted with `bag_deadline_at` in the past (or at
    -1e300, 1e300) was accepted and at once given up ("nothing more is started"), where `gridbot qos` refuses
    the same time."""
    message = submit_refused(app, msgspec.structs.replace(SWEEP, bag_deadline_at=at))
    assert needle in message, message
    later = time.time() + 3600
    assert app.submit(msgspec.structs.replace(SWEEP, bag_deadline_at=later)).status == 201


def test_a_bad_deadline_or_budget_change_is_a_400_naming_the_fix(app):
    """Issue 16's `gridbot qos` route: bad values are refused with a message that says what to give, and the
    bag's stored spec does not change (`refused` compares the store before and after)."""
    assert app.submit(SWEEP).status == 201
    for body, needle in ((b'{"budget": -5}', "finite number >= 0"), (b'{"budget": "lots"}', ""),
                         (b'{"bag_deadline": "tomorrow"}', "a bag deadline is a duration"),
                         (b'{"bag_deadline": "2020-01-01T00:00:00Z"}', "has passed"),
                         (b'{"bag_deadline": "2026-11-27T17:00:00"}', "needs its time zone"),
                         (b"{}", "give a budget or a bag_deadline"), (b"\xff", "")):
        message = refused(app, "POST", "/v1/bags/sweep/qos", body, content_type="application/json")
        assert needle in message, (body, message)


def test_a_strategy_change_naming_no_placement_on_a_bag_with_a_deadline_says_what_is_wrong(app):
    """Audit: `POST /v1/bags/{bag}/strategy {}` on a bag with a deadline said "the strategies 'gridbot' and 'gridbot'
    cannot start": the tail's name and the placement's, unlabelled, both 'gridbot' by default; the trouble is that
    a change naming no placement asks for 'gridbot', which keeps no deadline, where the bag has cost-time."""
    assert app.submit(msgspec.structs.replace(SWEEP, bag_deadline=3600.0)).status == 201
    message = refused(app, "POST", "/v1/bags/sweep/strategy", b"{}", content_type="application/json")
    assert "'gridbot' and 'gridbot'" not in message and "cannot start" not in message, message
    assert "placement 'gridbot' does not keep a bag's bag_deadline" in message, message
    assert "bag sweep has placement 'cost-time' now, and a change that names no placement asks for 'gridbot'" \
        in message, message
    ok = app.call("POST", "/v1/bags/sweep/strategy", b'{"tail": "gridbot", "placement": "cost-time"}',
                  content_type="application/json")
    assert ok.status == 200, ok.body[:300]


def test_a_retry_with_both_indices_and_a_revision_is_a_400_naming_both(app):
    """Audit: `POST /v1/bags/{bag}/retry` with `indices` and `revision` made the revision and queued every job
    not done, ignoring `indices` without a word (the command line refuses --jobs with --spec)."""
    from gridbot.protocol import RetryRequest, SubmitRequest

    assert app.submit(SWEEP).status == 201
    revised = SubmitRequest(msgspec.structs.replace(SWEEP, command="echo again {x}"))
    message = refused(app, "POST", "/v1/bags/sweep/retry", msgspec.msgpack.encode(RetryRequest([3], revised)))
    assert "give indices (failed jobs to queue again) or revision" in message and "not both" in message, message


@pytest.mark.parametrize("value", [2**63, 2**64 - 1, -1])
def test_integers_beyond_what_the_store_holds_are_a_400(app, value):
    assert app.submit(SWEEP).status == 201
    held = [a.instance_id for a in app.exchange(2, []).assignments]
    host = {"host_id": app.host_id, "name": "h"}
    for msg in ({"host": host, "want": value, "running": held},
                {"host": host, "want": 0, "running": [*held, value]},
                {"host": host, "want": 0, "running": held, "reports": [{"instance_id": value, "outcome": "success"}]},
                {"host": host, "want": 0, "running": held[1:],
                 "reports": [{"instance_id": held[0], "outcome": "success", "exit_code": 2**31}]},
                {"host": {**host, "memory_mb": value}, "want": 0, "running": held}):
        refused(app, "POST", "/v1/exchange", msgspec.msgpack.encode(msg), token=app.credential)


def test_a_host_may_not_claim_more_slots_than_a_pilot_may_have(app):
    """Found by the bad-input hunt: slots = 2^31 - 1 passed, and ExPERT's planner then counted a machine per slot."""
    host = {"host_id": app.host_id, "name": "h"}
    for field in ("slots", "ncpus"):
        message = refused(app, "POST", "/v1/exchange", msgspec.msgpack.encode(
            {"host": {**host, field: 65537}, "want": 0, "running": []}), token=app.credential)
        assert "65536" in message and field in message, message
    ok = {"host": {**host, "slots": 65536, "ncpus": 65536}, "want": 0, "running": []}
    assert app.call("POST", "/v1/exchange", msgspec.msgpack.encode(ok), token=app.credential).status == 200


@pytest.mark.parametrize("path", ["/v1/bags/99999999999999999999999", "/v1/bags/%C2%B2", "/v1/bags/%00",
                                  f"/v1/bags/{2**63}", "/v1/bags/sweep/jobs/99999999999999999999999/instances",
                                  "/v1/bags/sweep/logs/99999999999999999999999", "/v1/bags/sweep/logs/%D9%A1",
                                  "/v1/bags/sweep/inputs/%00", "/v1/bags/" + "x" * 5000])
def test_a_path_naming_nothing_is_a_404_not_a_500(app, path):
    assert app.submit(SWEEP).status == 201
    refused(app, "GET", path, status=404)


@pytest.mark.parametrize("query", ["limit=99999999999999999999", "after=-1", "after=1_000", "limit=%D9%A1",
                                   "state=nope", "after=" + "9" * 5000])
def test_a_bad_query_parameter_is_a_400(app, query):
    assert app.submit(SWEEP).status == 201
    key, _, value = query.partition("=")
    from urllib.parse import unquote

    message = refused(app, "GET", "/v1/bags/sweep/jobs", params={key: unquote(value)})
    assert key in message


@pytest.mark.parametrize(("path", "query", "says"), [
    ("/v1/bags/sweep/jobs", "after=-1", "out of range: give a whole number from 0 to 9223372036854775807"),
    ("/v1/bags/sweep/jobs", "limit=0", "out of range: give a whole number from 1 to 9223372036854775807"),
    ("/v1/bags/sweep/jobs", "limit=99999999999999999999", "out of range: give a whole number from 1 to"),
    ("/v1/bags/sweep/jobs", "after=1_000", "is not a whole number: give one from 0 to"),
    ("/v1/bags/sweep/jobs", "after=1.5", "is not a whole number: give one from 0 to"),
    ("/v1/console/hosts", "page=-5", "out of range: give a whole number from 0 to 9223372036854775807"),
    ("/v1/console/hosts", "size=" + "9" * 5000, "9999'... is out of range: give a whole number from 0 to"),
    ("/v1/console/hosts", "page=x", "is not a whole number: give one from 0 to"),
    ("/v1/console/hosts", "page=+5", "is written with a sign or leading zeros: give the number in digits alone"),
    ("/v1/bags/sweep/jobs", "after=" + "0" * 19 + "1", "written with a sign or leading zeros"),  # (review)
    ("/v1/bags/sweep/jobs", "after=-" + "9" * 5000, "out of range"),
    ("/v1/bags/sweep/wait", "timeout=-1", "out of range: give a number of seconds from 0 to 30"),
    ("/v1/bags/sweep/wait", "timeout=1e400", "out of range: give a number of seconds from 0 to 30"),
    ("/v1/bags/sweep/wait", "timeout=soon", "is not a number: give a number of seconds from 0 to 30")])
def test_a_query_number_out_of_range_says_so_and_gives_the_range(app, path, query, says):
    """Found by the bad-input hunt: `page=-5` was 'is not a whole number', as if it were written wrong; a
    number out of range now says so, with the range, and a word that is no number still says that."""
    assert app.submit(SWEEP).status == 201
    key, _, value = query.partition("=")
    message = refused(app, "GET", path, params={key: value})
    assert f"query parameter {key}=" in message and says in message, message


def test_only_a_walk_to_the_end_of_the_results_counts_as_downloading_them(app):
    """Found by the API review of 2026-11-27: an empty page, asked with `limit=0` or from beyond the last
    job, marked the bag's results downloaded, and a plain `gridbot delete` then destroyed results nobody
    had read."""
    assert app.submit(BagSpec("small", "echo {x}", [Parameter("x", start="1", stop="3", step="1")])).status == 201
    held = [a.instance_id for a in app.exchange(3, []).assignments]
    while held:
        reports = [{"instance_id": i, "outcome": "success", "exit_code": 0} for i in held]
        held = [a.instance_id for a in app.exchange(3, [], reports).assignments]
    row = app.service.store.bag("small")
    assert row is not None and row.state.value == "completed", row
    assert "limit='0'" in refused(app, "GET", "/v1/bags/small/results", params={"limit": "0"})
    assert app.call("GET", "/v1/bags/small/results", params={"after": str(2**62)}).body == b"[]"
    assert app.call("GET", "/v1/bags/small/results", params={"after": str(10**6)}).body == b"[]"
    assert app.service.store.bag("small").downloaded_at is None
    assert app.call("DELETE", "/v1/bags/small").status == 409, "the results were never read"
    page = msgspec.json.decode(app.call("GET", "/v1/bags/small/results").body)
    assert len(page) == 3
    last = page[-1]["job"]["job_id"]
    assert app.call("GET", "/v1/bags/small/results", params={"after": str(last)}).body == b"[]"
    assert app.service.store.bag("small").downloaded_at is not None
    assert app.call("DELETE", "/v1/bags/small").status == 200


def test_a_route_that_does_not_exist_answers_json(app):
    reply = app.call("GET", "/v1/bags/")
    assert reply.status == 404 and "no such route" in reply.message
    reply = app.call("PUT", "/v1/bags")
    assert reply.status == 405 and "use GET, HEAD, POST" in reply.message


# -- values that decode but cannot be stored ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_value_the_store_cannot_keep_fails_its_own_exchange_only(tmp_path, request, kind):
    """An exit code of 2^31 (PostgreSQL's integer) or 2^63 (SQLite's), a 1 MB host name: a 400 for that
    exchange, decided before the group commit, and the other exchanges of the same batch go through."""
    app = App(make_store(kind, tmp_path, request), config=CONFIG)
    try:
        assert app.submit(BASE).status == 201
        hosts = [app.new_host() for _ in range(4)]
        held = {}
        for host_id, credential in hosts:
            app.host_id, app.credential = host_id, credential
            held[host_id] = [a.instance_id for a in app.exchange(1, []).assignments]

        def body(i: int, host_id: str, bad: dict[str, Any]) -> bytes:
            (iid,) = held[host_id]
            report = {"instance_id": iid, "outcome": "success", "exit_code": 0, **bad.get("report", {})}
            return msgspec.msgpack.encode({"host": {"host_id": host_id, "name": "h", **bad.get("host", {})},
                                           "want": 0, "running": [], "reports": [report]})

        bad = [{"report": {"exit_code": 2**31}}, {"report": {"exit_code": 2**63}}, {"host": {"name": "n" * (1 << 20)}}]
        for b in bad:
            calls = [(token, body(i, host_id, b if i == 0 else {})) for i, (host_id, token) in enumerate(hosts)]
            replies = app.loop.run_until_complete(_together(app, calls))
            assert replies[0].status == 400, replies[0]
            assert [r.status for r in replies[1:]] == [200, 200, 200], replies
            for host_id, credential in hosts[1:]:  # they reported their instance: give them another
                app.host_id, app.credential = host_id, credential
                held[host_id] = [a.instance_id for a in app.exchange(1, []).assignments]
        assert app.service.store.bag("base").counts.done == 9
    finally:
        app.close()
        app.service.store.close()


async def _together(app: App, calls: list[tuple[str, bytes]]) -> list[Reply]:
    """Exchanges sent at once, so that the server decides them all before one commit."""
    async def one(token: str, body: bytes) -> Reply:
        async with app.client.post("/v1/exchange", data=body, headers={
                "Authorization": f"Bearer {token}", "Content-Type": MSGPACK}) as r:
            return Reply(r.status, await r.read())

    return list(await asyncio.gather(*(one(t, b) for t, b in calls)))


# -- a sweep too large to store, a command too long to run ----------------------------------------------


def test_a_sweep_of_a_trillion_jobs_is_refused_at_once_whatever_max_jobs_says(app, tmp_path):
    text = 'command = "echo {i}"\n[parameters]\ni = { from = 1, to = 1000000000000 }\n'
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        parse_spec(text, "big.toml", "big", max_jobs=10**13)
    (problem,) = info.value.problems
    assert f"at most {HARD_MAX_JOBS:,} in one bag, whatever --max-jobs says" in problem.message
    assert "writes every job into its database" in problem.message and "split" in problem.hint
    big = Service(MemoryStore(), ServiceConfig(max_jobs=10**13))
    spec = BagSpec("big", "echo {i}", [Parameter("i", start="1", stop="1000000000000", step="1")])
    with pytest.raises(Exception, match="whatever --max-jobs says"):
        big.submit(spec, None, {}, 1.0)
    assert big.store.bags() == []
    assert "whatever --max-jobs says" in submit_refused(app, spec)
    assert time.monotonic() - start < 5


def test_lines_over_the_hard_limit_are_refused(monkeypatch):
    import gridbot.model.spec as spec_module

    monkeypatch.setattr(spec_module, "HARD_MAX_JOBS", 2)
    with pytest.raises(SpecError, match="whatever --max-jobs says"):
        parse_lines("true\ntrue\ntrue\n", "lines.txt", max_jobs=10**13)


def test_a_command_too_long_to_run_is_refused(app):
    long = "echo " + "x" * (1 << 20)
    with pytest.raises(SpecError, match="Linux refuses an argument"):
        parse_spec(f'command = "{long}"\n', "s.toml", "s")
    with pytest.raises(SpecError, match="over the limit of 100,000 for a command"):
        parse_lines(f"true\n{long}\n", "lines.txt")
    assert f"over the limit of {MAX_COMMAND_BYTES:,}" in submit_refused(app, BagSpec("long", long))
    assert "line 2" in submit_refused(app, BagSpec("long", each_line=True), ["true", long])
    # the filled-in command counts: a short template with long values
    values = Parameter("v", values=["y" * 60_000])
    assert "with the longest values filled in" in submit_refused(app, BagSpec("long", "{v} {v}", [values]))
    assert "NUL" in submit_refused(app, BagSpec("nul", "a\0b"))
    assert "no command" in submit_refused(app, BagSpec("blank", each_line=True), ["true", "   "])


def test_the_summary_shows_a_long_command_cut_and_as_it_is(capsys):
    job = JobInfo(0, 7, "failed", "echo [/x] " + "x" * 200_000, 3, 3, "exit code 1 [bold]")
    info = BagInfo(1, "b", "done", 1, BagCounts(failed=1), 0.0, 1.0, "h")
    render.summary(info, None, [job])
    out = capsys.readouterr().out
    assert len(out) < 5_000 and "echo [/x] xxx" in out and "more characters" in out and "[bold]" in out


@pytest.mark.parametrize("error", [ValueError("a bug"), msgspec.ValidationError("a stored spec that does not decode"),
                                   UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a bug"), OverflowError("a bug")])
def test_a_bug_of_our_own_is_still_a_500_and_logged(app, monkeypatch, caplog, error):
    """Errors of bad input are caught where the input is read; the same errors raised by our own code are
    bugs, and answer 500 with the traceback in the log, not a 400 that blames the client."""
    assert app.submit(SWEEP).status == 201

    def broken(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(app.service, "jobs", broken)
    reply = app.call("GET", "/v1/bags/sweep/jobs")
    assert reply.status == 500 and "server log" in reply.message
    assert "internal error on GET /v1/bags/sweep/jobs" in caplog.text


def test_what_a_real_worker_sends_is_accepted():
    """The new limits on what hosts send cover what gridbot's worker sends about itself."""
    import os
    import platform
    import socket

    from gridbot.server.app import _decode, _exchange_decoder
    from gridbot.worker.hostid import acquire

    identity = acquire("fuzz-slot")
    try:
        host = HostInfo(identity.host_id, identity.name, f"{platform.system()}-{platform.machine()}",
                        os.cpu_count() or 1, 64_000, 8, "local", 16)
        req = _decode(_exchange_decoder, msgspec.msgpack.encode(ExchangeRequest(host, 8, [1, 2], [])))
        assert req.host == host and socket.gethostname() in host.name
    finally:
        identity.release()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_what_postgresql_text_cannot_hold_is_refused_first(tmp_path, request, kind):
    """A NUL in a line of an each-line bag, or in the name of an input file the spec does not name: a 500
    from PostgreSQL (its text cannot hold NUL) after the bag was half checked; now a 400, nothing stored."""
    from gridbot.protocol import SubmitRequest

    app = App(make_store(kind, tmp_path, request), config=CONFIG)
    try:
        assert "NUL" in submit_refused(app, BagSpec("lines", each_line=True), ["echo a\0b"])
        body = msgspec.msgpack.encode(SubmitRequest(BagSpec("inp", "true", inputs=["a"]), None,
                                                    {"a": b"x", "b\0": b"y"}))
        assert "names no such input" in refused(app, "POST", "/v1/bags", body)
    finally:
        app.close()
        app.service.store.close()


def test_a_policy_slow_on_one_host_is_set_aside_after_a_second_of_it(app):
    """Found by the bad-input hunt: a regular expression that backtracks on long host names passed the submission
    trial (skipped on the typical host's short name) and then took 0.22 s per evaluation on a host named like an
    EC2 instance: five such bags stalled that host's every exchange for seconds, and the health check with it.
    Now each bag may cost the dispatcher about a second of slow evaluations; its policies are then set aside (no
    host, no pool) and `gridbot status` says why."""
    slow = '(size(Host.Name) <= 21 || regexp("^([^#]|[^#])+$", strcat(Host.Name, "#"))) || true'
    spec = BagSpec("slow", "echo {x}", [Parameter("x", start="1", stop="5", step="1")],
                   policy={"JobRequirements": slow})
    assert app.submit(spec).status == 201, "the trial on a typical host passes it"
    host = HostInfo(app.host_id, "ip-10-0-0-12.ec2.internal/3")
    got = []
    for _ in range(12):
        reply = app.exchange_raw(msgspec.msgpack.encode(ExchangeRequest(host, 1, [])))
        assert reply.status == 200, reply.body[:300]
        got += msgspec.msgpack.decode(reply.body, type=ExchangeResponse).assignments
    info = app.call("GET", "/v1/bags/slow")
    notes = msgspec.json.decode(info.body)["diagnostics"]
    assert any("the bag's policies were set aside" in n and "JobRequirements took" in n
               and "host ip-10-0-0-12.ec2.internal/3" in n for n in notes), notes
    assert app.service.dispatcher.view.bag(1) is not None
    assert len(got) <= 8, "set aside after about a second of 0.2 s evaluations, it is sent nowhere"
    fast = app.call("POST", "/v1/bags/slow/policy", b'{"name": "JobRequirements", "text": "true"}',
                    content_type="application/json")
    assert fast.status == 200, fast.body[:300]
    assert not any("set aside" in n for n in msgspec.json.decode(app.call("GET", "/v1/bags/slow").body)["diagnostics"])


def test_specs_that_lost_something_without_a_word_are_refused(app):
    """Found by the bad-input hunt: an each-line bag's command and parameters were dropped (201, the lines ran),
    and outputs 'a' and 'a/b' (one a file and a folder at once) failed every download of the bag's results."""
    for spec, lines, needle in (
            (BagSpec("el", "rm -rf /", each_line=True), ["echo a"], "it has no command or parameters of its own"),
            (BagSpec("el", each_line=True, parameters=[Parameter("x", values=["1", "2"])]), ["echo a"],
             "it has no command or parameters of its own"),
            (BagSpec("o", "true", outputs=["a", "a/b"]), None, "outputs 'a' and 'a/b' cannot both be"),
            (BagSpec("o", "true", outputs=["a", "a"]), None, "output 'a' is listed twice")):
        assert needle in submit_refused(app, spec, lines)
    assert app.submit(BagSpec("o", "true", outputs=["x/y", "x/z"])).status == 201


def test_a_field_the_server_does_not_know_is_refused_naming_the_closest_not_dropped(app):
    """Found by the bad-input audit of 2026-11-29: a submitted spec's unknown keys were dropped without a word (a
    misspelled `instance_deadlin` left the default deadline), and so were a strategy change's (`{"tial":
    "expert"}` kept GridBot's tail) and a qos change's."""
    spec = msgspec.to_builtins(SWEEP)
    spec["instance_deadlin"] = 600
    message = refused(app, "POST", "/v1/bags", msgspec.msgpack.encode({"spec": spec}))
    assert "unknown field `instance_deadlin`" in message and "did you mean `instance_deadline`?" in message, message
    spec = msgspec.to_builtins(SWEEP)
    spec["strategy"] = {"tial": "expert"}
    message = refused(app, "POST", "/v1/bags", msgspec.msgpack.encode({"spec": spec}))
    assert "unknown field `tial`" in message and "did you mean `tail`?" in message, message
    assert "`lnes`" in refused(app, "POST", "/v1/bags", msgspec.msgpack.encode({"spec": msgspec.to_builtins(SWEEP),
                                                                                "lnes": ["true"]}))
    assert app.submit(SWEEP).status == 201
    for path, body, field in (("/v1/bags/sweep/strategy", b'{"tial": "expert"}', "tial"),
                              ("/v1/bags/sweep/qos", b'{"budget": 5, "bag_deadlin": "1h"}', "bag_deadlin"),
                              ("/v1/bags/sweep/policy", b'{"name": "Rank", "text": "1", "txt": "2"}', "txt")):
        message = refused(app, "POST", path, body, content_type="application/json")
        assert f"unknown field `{field}`" in message, (path, message)


def test_a_spec_sent_with_every_field_it_knows_is_stored_as_a_plain_spec(app):
    """The strict types that refuse unknown fields are the request's only: what the server keeps and answers is a
    plain BagSpec, equal to the one sent."""
    from gridbot.model.spec import StrategyChoice

    spec = msgspec.structs.replace(SWEEP, strategy=StrategyChoice("gridbot", "gridbot", {}))
    assert app.submit(spec).status == 201
    stored = app.service.store.bag("sweep").spec
    [held] = [b.spec for b in app.service.dispatcher.view.bags()]
    for s in (stored, held):
        assert type(s) is BagSpec and type(s.strategy) is StrategyChoice and s == spec


def test_a_parameters_unknown_field_is_refused_too(app):
    spec = msgspec.to_builtins(SWEEP)
    spec["parameters"][0]["stpe"] = "2"
    message = refused(app, "POST", "/v1/bags", msgspec.msgpack.encode({"spec": spec}))
    assert "unknown field `stpe`" in message and "did you mean `step`?" in message, message


def test_a_client_sends_only_the_fields_set_so_a_field_added_later_does_not_break_an_older_server(app):
    """The review of 2026-11-29: clients sent every field, defaults included, so once a field was added to a spec,
    every submission of a newer client to an older server would be refused. `lean` sends what was set."""
    from gridbot.protocol import SubmitRequest, lean

    class NewerSpec(BagSpec, frozen=True):
        a_field_of_a_later_version: int = 0

    newer = NewerSpec(SWEEP.name, SWEEP.command, SWEEP.parameters)
    assert lean(SubmitRequest(newer)) == {"spec": {"name": "sweep", "command": "echo {x}", "parameters": [
        {"name": "x", "start": "1", "stop": "100", "step": "1"}]}}
    assert app.call("POST", "/v1/bags", msgspec.msgpack.encode(lean(SubmitRequest(newer)))).status == 201
    used = msgspec.structs.replace(newer, name="b2", a_field_of_a_later_version=3)
    message = refused(app, "POST", "/v1/bags", msgspec.msgpack.encode(lean(SubmitRequest(used))))
    assert "unknown field `a_field_of_a_later_version`" in message, "a request using what the server lacks is told"
