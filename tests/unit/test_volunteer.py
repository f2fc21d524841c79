"""Issue 19, the parts of the volunteer pool that need no BOINC client: the request reader, the code signature,
the wrapper and its result file, accounts, and the pools file's `kind = "volunteer"`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gridbot.model.pools import parse_pools
from gridbot.model.records import Assignment, Limits, Outcome
from gridbot.model.spec import SpecError
from gridbot.volunteer.accounts import AccountBook, AccountError, Accounts, Hosts, save_accounts
from gridbot.volunteer.jobs import instance_of, job_file, read_result, report_of, result_name
from gridbot.volunteer.request import RequestError, parse_request
from gridbot.volunteer.signing import Tokens, load_or_make_signer
from gridbot.volunteer.wrapper import SCRIPT

REQUEST = b"""<scheduler_request>
    <authenticator>abc</authenticator>
    <hostid>7</hostid>
    <rpc_seqno>3</rpc_seqno>
    <core_client_major_version>7</core_client_major_version>
    <core_client_minor_version>20</core_client_minor_version>
    <core_client_release>5</core_client_release>
    <work_req_seconds>532.8</work_req_seconds>
    <cpu_req_secs>532.8</cpu_req_secs>
    <cpu_req_instances>2.0</cpu_req_instances>
    <platform_name>x86_64-pc-linux-gnu</platform_name>
    <alt_platform><name>i686-pc-linux-gnu</name></alt_platform>
    <host_info><host_cpid>0cc28b09</host_cpid><domain_name>vm &amp; co</domain_name><p_ncpus>2</p_ncpus>
      <p_fpops>nan</p_fpops><m_nbytes>1e10</m_nbytes></host_info>
    <result>
        <name>gb1_x</name><final_cpu_time>1.5</final_cpu_time><final_elapsed_time>2</final_elapsed_time>
        <exit_status>0</exit_status><state>5</state>
        <stderr_out><core_client_version>7.20.5</core_client_version><![CDATA[<stderr_txt>hi</stderr_txt>]]>
        </stderr_out>
    </result>
    <other_results><other_result><name>gb2_y</name></other_result></other_results>
</scheduler_request>
"""


def test_a_request_is_read_with_every_value_bounded():
    req = parse_request(REQUEST)
    assert (req.authenticator, req.hostid, req.platform, req.alt_platforms) == ("abc", 7, "x86_64-pc-linux-gnu",
                                                                                ("i686-pc-linux-gnu",))
    assert (req.ncpus, req.fpops, req.cpid, req.domain_name) == (2, 1e9, "0cc28b09", "vm & co")  # nan: the default
    assert req.work_req_seconds == 532.8 and req.client_version == "7.20.5"
    assert req.results[0].name == "gb1_x" and req.results[0].state == 5 and "hi" in req.results[0].stderr_out
    assert req.other_results == ("gb2_y",)


def test_a_request_that_is_not_well_formed_is_read_tag_by_tag():
    req = parse_request(REQUEST.replace(b"&amp;", b"&").replace(b"</scheduler_request>", b""))
    assert req.authenticator == "abc" and req.other_results == ("gb2_y",) and req.results[0].name == "gb1_x"


@pytest.mark.parametrize("body", [b"", b"\xff\xfe", b"<other/>", b"<scheduler_request></scheduler_request>",
                                  b'<!DOCTYPE x [<!ENTITY a "b">]><scheduler_request>&a;</scheduler_request>'])
def test_what_is_not_a_request_is_refused_with_a_reason(body):
    with pytest.raises(RequestError):
        parse_request(body)


def test_the_code_signature_is_what_the_client_checks(tmp_path):
    signer = load_or_make_signer(tmp_path)
    assert (tmp_path / "code-sign-key.pem").stat().st_mode & 0o777 == 0o600
    text = signer.public_text
    assert text.startswith("1024\n") and text.endswith("\n.\n") and len(text.splitlines()) == 10
    sig = signer.sign(SCRIPT.encode())
    assert signer.verify(SCRIPT.encode(), sig) and not signer.verify(b"other", sig)
    assert load_or_make_signer(tmp_path) == signer  # kept, never made anew


def test_result_names_are_the_servers_own(tmp_path):
    tokens = Tokens.load_or_make(tmp_path)
    assert instance_of(tokens, result_name(tokens, 42)) == 42
    assert instance_of(tokens, "gb42_00000000") is None and instance_of(tokens, "x") is None


def _run_wrapper(tmp_path: Path, a: Assignment, inputs: dict[str, bytes]) -> bytes:
    slot = tmp_path / "slot"
    slot.mkdir(parents=True)
    names = []
    for k, (_, data) in enumerate(inputs.items()):
        (slot / f"gridbot_in_{k}").write_bytes(data)
        names.append(f"gridbot_in_{k}")
    (slot / "gridbot_job").write_bytes(job_file(a, names))
    (slot / "wrapper.sh").write_text(SCRIPT)
    subprocess.run(["/bin/sh", str(slot / "wrapper.sh")], cwd=slot, check=True, timeout=30, env={"PATH": os.defpath})
    assert (slot / "boinc_finish_called").read_text() == "0\n"
    return (slot / "gridbot_result").read_bytes()


def _assignment(command: str, outputs: list[str], timeout: float | None = None, env: dict | None = None):
    return Assignment(1, 1, 1, "b", 3, command, env or {}, ["in put.txt"], outputs, 1e10, timeout, Limits())


def test_the_wrapper_runs_the_job_and_packs_its_outputs(tmp_path):
    a = _assignment("tr a-z A-Z < 'in put.txt' > 'o 1.txt'; mkdir d; echo \"$X $GRIDBOT_JOB_INDEX\" > d/o2; "
                    "echo out; echo err >&2", ["o 1.txt", "d/o2"], env={"X": "it's"})
    data = _run_wrapper(tmp_path, a, {"in put.txt": b"abc\n"})
    report = report_of(1, 5, 0, 1.0, 2.0, "", data, a.outputs, 1 << 20)
    assert report.outcome is Outcome.SUCCESS, report
    assert report.outputs == {"o 1.txt": b"ABC\n", "d/o2": b"it's 3\n"}
    assert (report.stdout_tail, report.stderr_tail) == ("out\n", "err\n")


def test_a_failing_job_and_a_missing_output_are_failures(tmp_path):
    a = _assignment("echo oops >&2; exit 3", ["x"])
    report = report_of(1, 5, 0, 1.0, 2.0, "", _run_wrapper(tmp_path / "1", a, {"in put.txt": b""}), a.outputs, 1 << 20)
    assert report.outcome is Outcome.FAILURE and report.exit_code == 3 and "oops" in report.reason
    b = _assignment("true", ["x"])
    report = report_of(1, 5, 0, 1.0, 2.0, "", _run_wrapper(tmp_path / "2", b, {"in put.txt": b""}), b.outputs, 1 << 20)
    assert report.outcome is Outcome.FAILURE and "'x' was not produced" in report.reason


def test_the_wrapper_kills_a_job_at_its_timeout(tmp_path):
    a = _assignment("sleep 30", [], timeout=1)
    report = report_of(1, 5, 0, 1.0, 2.0, "", _run_wrapper(tmp_path, a, {"in put.txt": b""}), [], 1 << 20)
    assert report.outcome is Outcome.FAILURE and "timed out" in report.reason


def test_a_result_file_is_checked_frame_by_frame():
    good = b"gridbot-result 1\nstatus 0\nfile 0 3\nabc\nend\n"
    assert read_result(good, 1, 100).outputs == {0: b"abc"}
    for bad in (b"junk", good.replace(b"file 0 3", b"file 0 9"), good.replace(b"file 0", b"file 5"),
                b"gridbot-result 1\nstatus 0\n"):
        with pytest.raises(ValueError):
            read_result(bad, 1, 100)
    with pytest.raises(ValueError):
        read_result(good, 1, 2)  # over the size limit
    assert report_of(1, 5, 0, 0, 0, "", b"junk", [], 100).outcome is Outcome.FAILURE
    assert report_of(1, 6, -221, 0, 0, "", None, [], 100).outcome is Outcome.INTERRUPTED
    assert report_of(1, 3, 1, 0, 0, "x", None, [], 100).outcome is Outcome.FAILURE


def test_accounts_authenticate_until_revoked(tmp_path):
    path = tmp_path / "v.json"
    accounts = Accounts()
    key = accounts.add("alice", 0.0)
    with pytest.raises(AccountError):
        accounts.add("alice", 0.0)
    save_accounts(path, accounts)
    assert path.stat().st_mode & 0o777 == 0o600 and key not in path.read_text()
    book = AccountBook(path)
    account = book.authenticate(key)
    assert account is not None and account.name == "alice"
    wrong = key[:-1] + ("1" if key.endswith("0") else "0")
    assert book.authenticate(wrong) is None and book.authenticate("") is None
    hosts = Hosts(tmp_path / "hosts.json")
    first, new = hosts.resolve(account, 0, "cpid1", "p", 0.0)
    assert new and hosts.resolve(account, first.hostid, "cpid1", "p", 0.0) == (first, False)
    assert hosts.resolve(account, 0, "cpid1", "p", 0.0)[0] == first  # re-attached: found by its CPID
    assert Hosts(tmp_path / "hosts.json").resolve(account, 0, "cpid2", "p", 0.0)[0].hostid == first.hostid + 1
    # the security review of 2026-11-29: a client renaming itself at every request rewrote the file at each
    saved = []
    hosts._save = lambda: saved.append(first.name)  # type: ignore[method-assign]
    for n in range(50):
        hosts.note(first, f"name{n}", 2, 1e9)
    assert saved == ["name0"] and first.name == "name49", "noted in memory, written at most every NOTE_EVERY s"
    accounts.revoke("alice")
    save_accounts(path, accounts)
    book.refresh(force=True)
    assert book.authenticate(key) is None


def test_a_volunteer_pool_in_the_pools_file():
    [pool] = parse_pools('[pools.v]\nkind = "volunteer"\nport = 8471\npath = "/boinc/"\n', "p.toml")
    assert pool.reliability == "volunteer" and not pool.submits and pool.options["path"] == "/boinc/"
    for bad in ('port = "x"', 'port = 1\nurl = "http://localhost/"', 'port = 1\npath = "boinc"', ""):
        with pytest.raises(SpecError):
            parse_pools(f'[pools.v]\nkind = "volunteer"\n{bad}\n', "p.toml")


def _start_wrapper(slot: Path, a: Assignment) -> subprocess.Popen:
    """The wrapper in `slot`, as the client starts it, with the client's shared memory file (all zero)."""
    slot.mkdir(parents=True)
    (slot / "gridbot_in_0").write_bytes(b"")
    (slot / "gridbot_job").write_bytes(job_file(a, ["gridbot_in_0"]))
    (slot / "wrapper.sh").write_text(SCRIPT)
    (slot / "boinc_mmap_file").write_bytes(bytes(8192))
    return subprocess.Popen(["/bin/sh", str(slot / "wrapper.sh")], cwd=slot, env={"PATH": os.defpath})


def _client_says(slot: Path, message: bytes) -> None:
    """What the client's `MSG_CHANNEL::send_msg` does to the first channel: the message, then the flag byte."""
    with open(slot / "boinc_mmap_file", "r+b") as f:
        f.seek(1)
        f.write(message + b"\0")
        f.flush()
        f.seek(0)
        f.write(b"\1")


def _wait_for(check, timeout: float = 10.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_the_wrapper_suspends_and_resumes_the_job_when_the_client_says(tmp_path):
    import time
    slot = tmp_path / "slot"
    a = _assignment("i=0; while [ $i -lt 30 ]; do echo $i >> ticks; i=$((i + 1)); sleep 0.1; done; cp ticks out",
                    ["out"])
    proc = _start_wrapper(slot, a)
    ticks = slot / "gridbot_work" / "ticks"
    _wait_for(lambda: ticks.exists())
    _client_says(slot, b"<suspend/>")
    _wait_for(lambda: (slot / "boinc_mmap_file").read_bytes()[0] == 0, 5)  # the wrapper took the message
    time.sleep(0.3)
    frozen = ticks.read_text().count("\n")
    time.sleep(1.5)
    assert ticks.read_text().count("\n") == frozen < 30, "nothing runs while the client has it suspended"
    assert proc.poll() is None
    with open(slot / "boinc_mmap_file", "r+b") as f:  # an older, longer message's bytes after the next one's end
        f.seek(11)
        f.write(b"<suspend/>\0")
    _client_says(slot, b"<resume/>")  # "<resume/>\0<suspend/>": the message ends at its NUL
    assert proc.wait(20) == 0
    report = report_of(1, 5, 0, 1.0, 2.0, "", (slot / "gridbot_result").read_bytes(), a.outputs, 1 << 20)
    assert report.outcome is Outcome.SUCCESS, report
    assert report.outputs["out"] == "".join(f"{i}\n" for i in range(30)).encode()


def test_the_timeout_counts_the_time_the_job_ran_not_the_time_it_was_suspended(tmp_path):
    import time
    slot = tmp_path / "slot"
    a = _assignment("sleep 1; echo done > out", ["out"], timeout=3)
    proc = _start_wrapper(slot, a)
    _wait_for(lambda: (slot / "gridbot_work").exists())
    _client_says(slot, b"<suspend/>")
    time.sleep(4.5)  # past the timeout in wall time
    _client_says(slot, b"<resume/>")
    assert proc.wait(20) == 0
    report = report_of(1, 5, 0, 1.0, 2.0, "", (slot / "gridbot_result").read_bytes(), a.outputs, 1 << 20)
    assert report.outcome is Outcome.SUCCESS, report
