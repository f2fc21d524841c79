"""gridbot instances as BOINC work, and BOINC results back as instance reports.

Each instance is one BOINC workunit with one result, named after the instance id and a tag made with the
server's token secret (`gb42_1f3a9c0d`), so a name the client sends maps back to an instance without a
table, and a made-up one is recognised. The job file (`gridbot_job`, the wrapper's instructions) is written
for the instance when it is sent; the bag's inputs are served under names that carry their content's
digest, so a client fetches each input once for all the jobs of a bag and a revised input is a new file.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from gridbot.errors import GridbotError
from gridbot.model.records import Assignment, InstanceReport, Outcome
from gridbot.volunteer.signing import Tokens

RESULT_RE = re.compile(r"gb([0-9]{1,18})_([0-9a-f]{8})\Z")
OUTPUT_SUFFIX = "_out"
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
