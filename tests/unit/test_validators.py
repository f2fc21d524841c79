"""Issue 19: the quorums' validators: the pools file's `[validators.NAME]`, a spec's `compare`, and the command
the server runs on two results (server/validate.py), with real processes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gridbot.model.pools import parse_pools_file, parse_server_file
from gridbot.model.spec import SpecError, parse_spec
from gridbot.model.validators import ValidatorSpec
from gridbot.server.validate import compare, note


def test_a_pools_file_declares_validators_and_may_hold_nothing_else():
    pools, queues, validators = parse_server_file(
        '[validators.close]\ncommand = "python3 /opt/close.py --tol 1e-6"\ntimeout = "2m"\n'
        '[validators.exact]\ncommand = ["cmp", "-s"]\n', "pools.toml")
    assert (pools, queues) == ([], [])
    assert validators == [ValidatorSpec("close", ("python3", "/opt/close.py", "--tol", "1e-6"), 120.0),
                          ValidatorSpec("exact", ("cmp", "-s"), 60.0)]
    both = parse_server_file('[pools.here]\nkind = "local"\n[validators.x]\ncommand = "true"\n', "p")
    assert [p.name for p in both[0]] == ["here"] and [v.name for v in both[2]] == ["x"]
    assert parse_pools_file('[pools.here]\nkind = "local"\n[validators.x]\ncommand = "true"\n', "p")[0] == both[0]


@pytest.mark.parametrize(("text", "message", "line"), [
    ('[validators.x]\ntimeout = "1m"\n', "validator 'x' has no command", 1),
    ('[validators.x]\ncommand = ""\n', "validator 'x' has an empty command", 2),
    ('[validators.x]\ncommand = 3\n', "'command' must be a string or a list of strings", 2),
    ("[validators.x]\ncommand = \"a 'b\"\n", "cannot split its command into words", 2),
    ('[validators.x]\ncommand = "true"\ntimeout = "forever"\n', "'timeout' must be a duration", 3),
    ('[validators.x]\ncommand = "true"\ntimeout = 7200\n', "'timeout' must be a duration", 3),
    ('[validators.x]\ncommand = "true"\nshell = true\n', "unknown key 'shell' in validator 'x'", 3),
    ('[validators."2x"]\ncommand = "true"\n', "validator name '2x' must be a letter", 1),
    ('validators = 3\n', "'validators' must hold one table per validator", 1),
])
def test_a_wrong_validator_is_refused_with_its_line_and_a_hint(text, message, line):
    with pytest.raises(SpecError) as e:
        parse_server_file(text, "pools.toml")
    found = [p for p in e.value.problems if message in p.message]
    assert found and found[0].line == line and found[0].hint, e.value.problems


def test_a_spec_names_a_validator_only_with_a_quorum_and_a_valid_name():
    spec = parse_spec('command = "true"\nquorum = 2\ncompare = "close"\n', "s.toml", "s")
    assert spec.compare == "close"
    for text, message in (('command = "true"\ncompare = "close"\n', "add quorum = 2"),
                          ('command = "true"\nquorum = 2\ncompare = "no good"\n', "must name a validator"),
                          ('command = "true"\nquorum = 2\ncompare = 2\n', "'compare' must be a string")):
        with pytest.raises(SpecError) as e:
            parse_spec(text, "s.toml", "s")
        assert message in str(e.value), str(e.value)


def test_a_spec_without_compare_hashes_as_before():
    """A bag stored before `compare` existed still resumes: the field is out of the hash while it is unset."""
    from gridbot.store.base import LATER_FIELDS

    assert LATER_FIELDS["compare"] == ""


def validator(tmp_path: Path, body: str, timeout: float = 30.0) -> ValidatorSpec:
    script = tmp_path / "v.py"
    script.write_text(body)
    return ValidatorSpec("v", (sys.executable, str(script)), timeout)


SHOW = """\
import os, sys
from pathlib import Path
a, b = (Path(d) for d in sys.argv[1:3])
report = {p.name: sorted(x.name for x in p.iterdir()) for p in (a, b)}
ok = (a / "stdout").read_text() == "1.0\\n" and (b / "nested" / "o.txt").read_bytes() == b"B"
sys.exit(0 if ok and report == {"a": ["o.txt", "stdout"], "b": ["nested", "stdout"]}
         and "AWS_SECRET_ACCESS_KEY" not in os.environ else 1)
"""


def test_the_validator_sees_each_result_as_a_folder_of_stdout_and_outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "a pool's credential")
    v = validator(tmp_path, SHOW)
    assert compare(v, ("1.0\n", {"o.txt": b"A"}), ("2.0\n", {"nested/o.txt": b"B"})) == (True, "")
    assert compare(v, ("1.5\n", {"o.txt": b"A"}), ("2.0\n", {"nested/o.txt": b"B"})) == (False, "")


def test_a_validator_that_fails_or_hangs_decides_nothing(tmp_path, caplog):
    broken = validator(tmp_path, "import sys\nprint('no such column', file=sys.stderr)\nsys.exit(3)\n")
    assert compare(broken, ("", {}), ("", {})) == (None, "it exited with status 3; its message is in the server's log")
    assert "exited with status 3" in caplog.text and "it said: no such column" in caplog.text
    hang = validator(tmp_path, "import time\ntime.sleep(60)\n", timeout=0.5)
    assert compare(hang, ("", {}), ("", {})) == (None, "it took over its timeout of 0.5s")
    assert "took over its timeout of 0.5s" in caplog.text
    missing = ValidatorSpec("gone", (str(tmp_path / "no-such-program"),))
    assert compare(missing, ("", {}), ("", {})) == (None, "it could not start; the reason is in the server's log")
    assert "could not start" in caplog.text


def test_the_job_locks_serialize_each_jobs_comparisons_and_go_with_the_last_holder():
    from gridbot.server.validate import Validation

    validation = Validation(None, [])  # type: ignore[arg-type]
    order: list[str] = []

    async def hold(name: str, jobs: list[int], pause: float) -> None:
        async with validation.holding(jobs):
            order.append(f"{name} in")
            await asyncio.sleep(pause)
            order.append(f"{name} out")

    async def main() -> None:
        await asyncio.gather(hold("a", [2, 1], 0.05), hold("b", [1], 0.0), hold("c", [3], 0.0))

    asyncio.run(main())
    assert order.index("a out") < order.index("b in"), order
    assert order.index("c in") < order.index("a out"), "another job's comparisons do not wait"
    assert validation._locks == {}


def test_a_results_story_names_a_few_comparisons_however_many_groups_it_met():
    said = [f"different from instance {n}'s" for n in range(1, 40)] + ["equivalent to instance 40's"]
    assert note("close", said) == ("validator close: different from instance 1's; different from instance 2's; "
                                   "37 more compared; equivalent to instance 40's")
    assert note("close", said[-3:]) == "validator close: " + "; ".join(said[-3:])
