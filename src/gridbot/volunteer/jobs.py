"""gridbot instances as BOINC work, and BOINC results back as instance reports.

Each instance is one BOINC workunit with one result, named after the instance id and a tag made with the
server's token secret (`gb42_1f3a9c0d`), so a name the client sends maps back to an instance without a
table, and a made-up one is recognised. The job file (`gridbot_job`, the wrapper's instructions) is written
for the instance when it is sent, to the pool's `Spool` with the uploaded results; the bag's inputs are served
under names that carry their content's digest, so a client fetches each input once for all the jobs of a bag
and a revised input is a new file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from gridbot.errors import GridbotError
from gridbot.model.records import Assignment, InstanceReport, Outcome
from gridbot.volunteer.signing import Tokens

RESULT_RE = re.compile(r"gb([0-9]{1,18})_([0-9a-f]{8})\Z")
OUTPUT_SUFFIX = "_out"
"""A result's uploaded output file is its name and this; its job file (served to the client) is its name and
JOB_SUFFIX."""
JOB_SUFFIX = "_job"
JOB_META = b"# gridbot-meta "
"""The job file's first line: this, then JSON with the instance's declared outputs (read back at its report)."""
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ERR_ABORTED_BY_PROJECT = -221
STATE_UPLOADED, STATE_COMPUTE_ERROR, STATE_ABORTED = 5, 3, 6
STATES = {1: "a download failed", 2: "its files were downloaded but it never ran", 3: "the task failed on the host",
          4: "an upload failed", 5: "uploaded", 6: "it was aborted on the host"}


def result_name(tokens: Tokens, instance_id: int) -> str:
    """The BOINC result (and workunit, with `wu`) name of an instance."""
    return f"gb{instance_id}_{tokens.make('result', instance_id, length=8)}"


def instance_of(tokens: Tokens, name: str) -> int | None:
    """The instance a result name stands for, or None for a name this server did not make."""
    m = RESULT_RE.match(name)
    if m is None or not tokens.check(m.group(2), "result", int(m.group(1)), length=8):
        return None
    return int(m.group(1))


SEGMENT_BYTES = 8 << 20
"""A spool segment is closed for new records past this size (and removed once none of its records is live)."""
_SEGMENT_RE = re.compile(r"spool-([0-9]{6,12})\Z")
_RECORD_RE = re.compile(rb"([A-Za-z0-9_.-]{1,200}) ([0-9]{1,12})\n")
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class Spool:
    """The small files of the instances out (job files, uploaded results), as records appended to a few
    segment files instead of a file each.

    A file per instance was most of the server's time: creating a file waits on the file system's journal,
    which the store's commits (synchronous=FULL) keep busy, 0.3-0.8 ms a file on ext4 against a few
    microseconds to append to a file already open (docs/volunteers.md, "How fast"). A record is written with
    one `write` to the current segment, without fsync, as the files were: the kernel holds it once written,
    so it outlives the server's process, and an OS crash may lose the last records as it could lose those
    files (an instance whose job file is lost fails its download; one whose upload is lost is reported
    without it; either runs again, and the store's record of results, committed before a report is
    acknowledged, is not touched). A segment is removed once none of its records is live, and `compact`
    moves the few live records of a mostly dead one (long jobs among short ones) to the current segment, so
    the spool's files stay within about four times what is live. On start the segments left are read back
    (a torn last record is dropped) and new records go to a new segment. A drop is kept in memory only: a
    record dropped before a restart is read back, and removed by the pool's sweep with the records of the
    instances no longer out (their names are never used again: instance ids are not reused).
    """

    def __init__(self, folder: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._index: dict[str, tuple[int, int, int, float]] = {}
        """name: (segment, offset of its data, length, when it was written)."""
        self._fds: dict[int, int] = {}
        self._live: dict[int, int] = {}
        """Segment: its records live."""
        self._bytes: dict[int, int] = {}
        """Segment: the bytes of its records live."""
        self._sizes: dict[int, int] = {}
        self._current = -1
        numbers = sorted(int(m.group(1)) for p in folder.iterdir() if (m := _SEGMENT_RE.match(p.name)))
        for n in numbers:
            self._recover(n)
        self._roll(numbers[-1] + 1 if numbers else 1)

    def _path(self, n: int) -> Path:
        return self.folder / f"spool-{n:06d}"

    def _recover(self, n: int) -> None:
        """Index the records of segment `n` a previous run left."""
        fd = os.open(self._path(n), os.O_RDONLY)
        with open(fd, "rb", closefd=False) as f:
            data = f.read()
        self._fds[n], self._live[n], self._bytes[n], self._sizes[n] = fd, 0, 0, len(data)
        self._current = n  # not removed while it is read, should a name come twice in it
        pos, now = 0, time.time()
        while (m := _RECORD_RE.match(data, pos)) is not None:
            length = int(m.group(2))
            start = m.end()
            if start + length + 1 > len(data) or data[start + length] != 0x0A:
                break  # torn: the rest of the segment is not read
            self._add(m.group(1).decode(), n, start, length, now)
            pos = start + length + 1
        self._current = -1
        self._release(n)

    def _roll(self, n: int) -> None:
        """Start segment `n` for new records (the one before it is removed if it holds nothing live)."""
        old = self._current
        self._fds[n] = os.open(self._path(n), os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        self._live[n], self._bytes[n], self._sizes[n], self._current = 0, 0, 0, n
        if old >= 0:
            self._release(old)

    def _add(self, name: str, n: int, offset: int, length: int, when: float) -> None:
        self.drop(name)
        self._index[name] = (n, offset, length, when)
        self._live[n] += 1
        self._bytes[n] += length

    def _release(self, n: int) -> None:
        """Remove segment `n` if it is not the current one and none of its records is live."""
        if n != self._current and self._live.get(n) == 0:
            os.close(self._fds.pop(n))
            del self._live[n], self._bytes[n], self._sizes[n]
            with contextlib.suppress(OSError):
                self._path(n).unlink()

    def put(self, name: str, data: bytes, when: float | None = None) -> None:
        """Keep `data` as `name` (replacing what was kept as `name`), written at `when` (now); OSError if it
        cannot be written; ValueError for a name the segments cannot hold (the server's names always can)."""
        if not _NAME_RE.fullmatch(name):
            raise ValueError(f"spool record name {name[:50]!r} is not 1-200 letters, digits, '_', '.' or '-'")
        record = b"%s %d\n%s\n" % (name.encode(), len(data), data)
        n = self._current
        at = self._sizes[n]
        try:
            done = 0
            while done < len(record):
                done += os.write(self._fds[n], record[done:] if done else record)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fds[n], at)  # never a record after a torn one
            self._sizes[n] = os.fstat(self._fds[n]).st_size
            raise
        self._sizes[n] = at + len(record)
        self._add(name, n, at + len(record) - len(data) - 1, len(data), time.time() if when is None else when)
        if self._sizes[n] >= self.segment_bytes:
            self._roll(n + 1)

    def get(self, name: str) -> bytes | None:
        """What is kept as `name` (None: nothing)."""
        entry = self._index.get(name)
        if entry is None:
            return None
        n, offset, length, _ = entry
        return os.pread(self._fds[n], length, offset)

    def size(self, name: str) -> int | None:
        entry = self._index.get(name)
        return entry[2] if entry is not None else None

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self._index)

    def drop(self, name: str) -> bool:
        """Forget `name` (False: nothing was kept as it); a segment left with nothing live is removed."""
        entry = self._index.pop(name, None)
        if entry is None:
            return False
        self._live[entry[0]] -= 1
        self._bytes[entry[0]] -= entry[2]
        self._release(entry[0])
        return True

    def compact(self) -> int:
        """Copy the live records of the segments less than a quarter live to the current segment (those
        segments are then removed); returns the records copied. OSError if one cannot be written."""
        sparse = {n for n, size in self._sizes.items() if n != self._current and 4 * self._bytes[n] < size}
        moved = [(name, entry) for name, entry in self._index.items() if entry[0] in sparse]
        for name, (n, offset, length, when) in moved:
            self.put(name, os.pread(self._fds[n], length, offset), when)
        return len(moved)

    def older(self, seconds: float) -> list[str]:
        """The names kept for more than `seconds`."""
        cutoff = time.time() - seconds
        return [name for name, entry in self._index.items() if entry[3] < cutoff]

    @property
    def segments(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def quote(text: str) -> str:
    """`text` as one sh word."""
    return "'" + text.replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class InputFile:
    """A bag input as the client fetches it: its BOINC file name, size and MD5."""

    name: str
    nbytes: int
    md5: str


def input_file_name(bag_id: int, position: int, data: bytes) -> str:
    """The BOINC name of a bag's input number `position` with content `data`."""
    return f"gbi{bag_id}_{position}_{hashlib.sha256(data).hexdigest()[:16]}"


def job_file(a: Assignment, staged: list[str]) -> bytes:
    """The `gridbot_job` fragment the wrapper sources for instance `a`; `staged` names its input files' slot
    names in the order of `a.inputs`."""
    env = {**a.env, "GRIDBOT_JOB_INDEX": str(a.index), "GRIDBOT_JOB_ID": str(a.job_id),
           "GRIDBOT_INSTANCE": str(a.instance_id), "GRIDBOT_BAG": a.bag_name}
    meta = JOB_META + json.dumps({"outputs": a.outputs, "bag": a.bag_id}).encode()
    lines = [meta.decode(),
             f"# gridbot job: bag {a.bag_name!r} job {a.index} instance {a.instance_id}".replace("\n", " "),
             f"gridbot_timeout={int(a.timeout) if a.timeout else 0}",
             f"gridbot_command={quote(a.command)}",
             f"gridbot_noutputs={len(a.outputs)}"]
    lines += [f"gridbot_output_{k}={quote(name)}" for k, name in enumerate(a.outputs)]
    lines.append("gridbot_stage() {")
    lines += [f"    cp -f ../{slot} {quote(name)}" for slot, name in zip(staged, a.inputs, strict=True)]
    lines += ["    :", "}", "gridbot_env() {"]
    lines += [f"    export {k}={quote(v)}" for k, v in env.items() if ENV_NAME_RE.match(k)]
    lines += ["    :", "}", "gridbot_limits() {"]
    limits = a.limits
    if limits is not None:
        if limits.memory:
            lines.append(f"    ulimit -v {max(1, limits.memory // 1024)} 2>/dev/null")
        if limits.cpu_time:
            lines.append(f"    ulimit -t {max(1, int(limits.cpu_time + 0.999))} 2>/dev/null")
        if limits.max_file_size:
            lines.append(f"    ulimit -f {max(1, limits.max_file_size // 512)} 2>/dev/null")
        if limits.max_processes:
            lines.append(f"    ulimit -u {limits.max_processes} 2>/dev/null")
    lines += ["    :", "}", ""]
    return "\n".join(lines).encode()


class ResultError(GridbotError, ValueError):
    """An uploaded result file the wrapper did not write."""


@dataclass
class ResultFile:
    """What the wrapper reported of one run (see wrapper.py for the format)."""

    status: int | None = None
    timeout: str = ""
    stdout: bytes = b""
    stderr: bytes = b""
    outputs: dict[int, bytes] | None = None
    missing: list[int] | None = None


def read_result(data: bytes, noutputs: int, limit: int) -> ResultFile:
    """The wrapper's result file, checked frame by frame (ResultError if it is not one, or holds more than
    `limit` bytes of files)."""
    out = ResultFile(outputs={}, missing=[])
    assert out.outputs is not None and out.missing is not None
    pos, total = 0, 0

    def line() -> str:
        nonlocal pos
        end = data.find(b"\n", pos)
        if end < 0 or end - pos > 200:
            raise ResultError("a line of the result file is cut or too long")
        text = data[pos:end].decode("ascii", errors="replace")
        pos = end + 1
        return text

    if line() != "gridbot-result 1":
        raise ResultError("the file is not a gridbot result (another wrapper version?)")
    while True:
        words = line().split(" ")
        if words == ["end"]:
            return out
        if words[0] == "status" and len(words) == 2 and re.fullmatch(r"-?[0-9]{1,10}", words[1]):
            out.status = int(words[1])
        elif words[0] == "timeout" and len(words) == 2:
            out.timeout = words[1][:20]
        elif words[0] == "missing" and len(words) == 2 and words[1].isdigit() and int(words[1]) < noutputs:
            out.missing.append(int(words[1]))
        elif words[0] == "file" and len(words) == 3 and words[2].isdigit():
            size = int(words[2])
            total += size
            if total > limit or pos + size + 1 > len(data) or data[pos + size:pos + size + 1] != b"\n":
                raise ResultError("a file of the result is cut, or the files are over the size limit")
            body = data[pos:pos + size]
            pos += size + 1
            if words[1] == "stdout":
                out.stdout = body
            elif words[1] == "stderr":
                out.stderr = body
            elif words[1].isdigit() and int(words[1]) < noutputs:
                out.outputs[int(words[1])] = body
            else:
                raise ResultError(f"the result holds an unknown file {words[1][:20]!r}")
        else:
            raise ResultError(f"unknown line in the result file: {' '.join(words)[:60]!r}")


def report_of(instance_id: int, state: int, exit_status: int, cpu: float, wall: float, stderr_out: str,
              uploaded: bytes | None, outputs: list[str], limit: int) -> InstanceReport:
    """The instance report for a BOINC result the client reported, with its uploaded file if any.

    Success needs the upload, an exit status 0 and every declared output, as a gridbot worker's does; an
    abort is an interruption (the job is queued again without a failure counted); anything else failed."""
    cpu, wall = min(max(cpu, 0.0), 1e12), min(max(wall, 0.0), 1e12)
    tail = stderr_out[-4096:]

    def failed(reason: str, code: int | None = None, out: bytes = b"", err: str = tail) -> InstanceReport:
        return InstanceReport(instance_id, Outcome.FAILURE, code, wall, cpu, reason[:2000],
                              out[-TAIL:].decode("utf-8", errors="replace"), err)

    if state == STATE_ABORTED:
        return InstanceReport(instance_id, Outcome.INTERRUPTED, None, wall, cpu,
                              "aborted on the volunteer's host" + (" (by the server)" if exit_status ==
                                                                   ERR_ABORTED_BY_PROJECT else ""))
    if state != STATE_UPLOADED:
        what = STATES.get(state, f"it ended in BOINC state {state}")
        return failed(f"BOINC: {what} (exit status {exit_status})", None)
    if uploaded is None:
        return failed("the client reported the result but its file was never uploaded")
    try:
        res = read_result(uploaded, len(outputs), limit)
    except ResultError as e:
        return failed(f"the uploaded result cannot be read: {e}")
    err = res.stderr[-TAIL:].decode("utf-8", errors="replace")
    code = res.status if res.status is not None and -(2**31) <= res.status < 2**31 else None
    if code is None:
        return failed("the wrapper reported no exit status", None, res.stdout, err)
    if res.timeout:
        return failed(f"timed out after {res.timeout} s (the bag's timeout)", code, res.stdout, err)
    if code != 0:
        last = [ln for ln in err.strip().splitlines() if ln.strip()]
        return failed(f"exit code {code}" + (f": {last[-1][:300]}" if last else ""), code, res.stdout, err)
    assert res.missing is not None and res.outputs is not None
    if res.missing:
        return failed(f"expected output '{outputs[res.missing[0]][:100]}' was not produced", code, res.stdout, err)
    if len(res.outputs) != len(outputs):
        return failed("the result lacks some declared outputs", code, res.stdout, err)
    return InstanceReport(instance_id, Outcome.SUCCESS, 0, wall, cpu, "",
                          res.stdout[-TAIL:].decode("utf-8", errors="replace"), err,
                          {outputs[k]: v for k, v in res.outputs.items()})


TAIL = 64 * 1024
