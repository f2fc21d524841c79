"""A bag's resource limits (issue "security", job isolation): the spec keys, their errors, and how they
travel to the worker in every assignment."""

from __future__ import annotations

import msgspec
import pytest

from gridbot.core.changes import BagSnapshot
from gridbot.model.records import Assignment, HostInfo, Limits
from gridbot.model.spec import BagSpec, SpecError, parse_size, parse_spec
from tests.unit.core_harness import CoreSim


def spec(extra: str) -> BagSpec:
    return parse_spec(f'command = "run"\n{extra}', "s.toml", "s")


def test_limits_from_the_spec():
    s = spec('memory = "2G"\ncpu_time = "10m"\nmax_file_size = "512M"\nmax_processes = 64\n')
    assert s.limits() == Limits(memory=2 << 30, cpu_time=600.0, max_file_size=512 << 20, max_processes=64)
    assert spec("").limits() is None, "no limit set: nothing to send"
    assert spec("memory = 1073741824\n").limits() == Limits(memory=1 << 30), "a number is bytes"


@pytest.mark.parametrize(("text", "size"), [
    ("1024", 1024), ("512K", 512 << 10), ("100M", 100 << 20), ("100MB", 100 << 20), ("100mib", 100 << 20),
    ("1.5G", 3 << 29), (" 2 G ", 2 << 30), ("1T", 1 << 40),
])
def test_sizes(text, size):
    assert parse_size(text) == size
    assert parse_size(4096) == 4096


@pytest.mark.parametrize("value", ["", "lots", "-1M", "1.5.2G", "10X", True, 0, -5, 1.5])
def test_what_is_not_a_size(value):
    with pytest.raises(ValueError, match="size"):
        parse_size(value)


@pytest.mark.parametrize(("text", "line", "needle"), [
    ('memory = "lots"\n', 2, "a size is a number of bytes or a string like '512K', '100M', '2G'"),
    ("memory = 100\n", 2, 'did you mean memory = "100M"?'),
    ('memory = "10K"\n', 2, "less than 1,048,576"),
    ('max_file_size = "0M"\n', 2, "a size must be positive"),
    ('max_file_size = "0.4"\n', 2, "'0.4' is less than one byte (a size without a unit is in bytes)"),
    ('max_file_size = "0.0001K"\n', 2, "'0.0001K' is less than one byte write"),  # no word of a missing unit
    ("cpu_time = 0\n", 2, "a duration must be positive"),
    ('cpu_time = "forever"\n', 2, "'cpu_time' = 'forever': a duration is"),
    ("max_processes = 0\n", 2, "'max_processes' must be a whole number of at least 1"),
    ('max_processes = "64"\n', 2, "whole number"),
    ('memmory = "1G"\n', 2, "did you mean 'memory'?"),
])
def test_bad_limits_name_the_line_and_what_to_write(text, line, needle):
    with pytest.raises(SpecError) as info:
        spec(text)
    found = [(p.line, f"{p.message} {p.hint}") for p in info.value.problems]
    assert any(needle in m and ln == line for ln, m in found), found


def test_a_spec_from_the_api_with_nonsense_limits_has_none():
    """A spec that did not come through the TOML validator cannot make the worker set a limit of 0 or -1."""
    s = msgspec.structs.replace(spec(""), memory=-1, cpu_time=float("nan"), max_file_size=0,
                                max_processes=-3)
    assert s.limits() is None
    assert msgspec.structs.replace(spec(""), cpu_time=float("inf")).limits() is None


def test_an_assignment_of_an_older_server_decodes_without_limits():
    class OldAssignment(msgspec.Struct):
        instance_id: int
        job_id: int
        bag_id: int
        bag_name: str
        index: int
        command: str
        env: dict[str, str]
        inputs: list[str]
        outputs: list[str]
        instance_deadline: float
        timeout: float | None = None

    old = msgspec.msgpack.encode(OldAssignment(1, 1, 1, "b", 0, "true", {}, [], [], 60.0))
    assert msgspec.msgpack.decode(old, type=Assignment).limits is None


def test_every_assignment_carries_its_bags_limits():
    sim = CoreSim()
    limited = parse_spec('command = "job {i}"\nmemory = "1G"\nmax_processes = 50\n[parameters]\ni = [1, 2]\n',
                         "t", "limited")
    row = sim.store.create_bag(limited, None, {}, 0.0)
    sim.d.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
    sim.bag("free", 2)
    sent = sim.ask(HostInfo("h1", "h1", slots=4), 4, 1.0)
    by_bag = {(a.bag_name, a.limits) for a in sent}
    assert by_bag == {("limited", Limits(memory=1 << 30, max_processes=50)), ("free", None)}
    first = [a.limits for a in sent if a.bag_name == "limited"]
    assert first[0] is first[1], "made once per bag, not per assignment"


def test_submit_reads_only_regular_files_and_no_more_than_it_may_send(tmp_path, monkeypatch):
    """Found by the bad-input hunt: `gridbot submit /dev/zero` (or an input file naming it) read until memory ran
    out, and a named pipe waited forever for a writer; the server's size limit only came after the read."""
    import os

    from gridbot import client
    from gridbot.errors import GridbotError

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in ("/dev/zero", fifo, tmp_path):
        with pytest.raises(GridbotError, match="is not a regular file"):
            client.load_spec_file(path)
        with pytest.raises(GridbotError, match="is not a regular file"):
            client.load_lines_file(path)
    (tmp_path / "z.toml").write_text('name = "z"\ncommand = "wc -c big"\ninputs = ["/dev/zero"]\n')
    with pytest.raises(GridbotError, match="input file /dev/zero is not a regular file"):
        client.load_spec_file(tmp_path / "z.toml")
    (tmp_path / "big").write_bytes(b"x" * 2000)
    (tmp_path / "small").write_bytes(b"y" * 10)
    (tmp_path / "b.toml").write_text('name = "b"\ncommand = "wc -c big"\ninputs = ["small", "big"]\n')
    monkeypatch.setattr(client, "INPUTS_LIMIT", 2000)
    with pytest.raises(GridbotError, match="big is 2,000 bytes, over the 1,990 read here"):
        client.load_spec_file(tmp_path / "b.toml")
    monkeypatch.setattr(client, "INPUTS_LIMIT", 2010)
    assert client.load_spec_file(tmp_path / "b.toml")[1] == {"small": b"y" * 10, "big": b"x" * 2000}
