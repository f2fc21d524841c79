"""Issue 19: stock BOINC clients (Debian's boinc-client, `scripts/boinc.sh install`) as a volunteer pool.

A real `gridbot server` with a volunteer pool on 127.0.0.1, two real clients with their own data folders and
GUI RPC ports, attached with `boinccmd --project_attach`: they fetch the signed wrapper, run a bag with inputs
and outputs, and every result arrives through gridbot's API. Forged uploads and bad scheduler requests are
refused with a 4xx; a cancelled bag's tasks are aborted on the clients; a killed client's jobs run again
elsewhere.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.harness import Cluster, free_port, gridbot, gridbot_json

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("boinc") is None or shutil.which("boinccmd") is None,
                       reason="needs the BOINC client: scripts/boinc.sh install (make test does it)"),
]

PREFS = """<global_preferences>
   <run_on_batteries>1</run_on_batteries>
   <run_if_user_active>1</run_if_user_active>
   <suspend_cpu_usage>0</suspend_cpu_usage>
   <max_ncpus_pct>100</max_ncpus_pct>
   <cpu_usage_limit>100</cpu_usage_limit>
   <work_buf_min_days>0</work_buf_min_days>
   <work_buf_additional_days>0</work_buf_additional_days>
   <disk_min_free_gb>0.1</disk_min_free_gb>
   <disk_max_used_pct>100</disk_max_used_pct>
   <idle_time_to_run>0</idle_time_to_run>
</global_preferences>
"""
"""Run whenever, whatever the machine's load (a busy test machine would otherwise suspend computing), and
keep no buffer: each client asks only for what its idle CPUs can take, so both share the bag."""


class BoincClient:
    """One stock client with its own data folder and GUI RPC port."""

    def __init__(self, folder: Path, env: dict[str, str] | None = None) -> None:
        self.folder = folder
        self.port = free_port()
        folder.mkdir(parents=True)
        (folder / "global_prefs_override.xml").write_text(PREFS)
        (folder / "gui_rpc_auth.cfg").write_text("")  # local control without a password (test only)
        (folder / "cc_config.xml").write_text("<cc_config><options><ncpus>2</ncpus></options></cc_config>\n")
        self.log = folder / "client.log"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["boinc", "--dir", str(folder), "--gui_rpc_port", str(self.port), "--no_info_fetch",
                 "--skip_cpu_benchmarks"], cwd=folder, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 30
        while self.cmd("--get_cc_status", check=False).returncode != 0:
            assert time.monotonic() < deadline, f"the BOINC client did not answer:\n{self.text()}"
            time.sleep(0.5)

    def cmd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["boinccmd", "--host", f"127.0.0.1:{self.port}", *args], cwd=self.folder,
                              capture_output=True, text=True, timeout=30)
        if check:
            assert proc.returncode == 0, f"boinccmd {args} failed: {proc.stdout}{proc.stderr}"
        return proc

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def kill(self) -> None:
        """Gone without a word, its tasks with it (a volunteer's machine switched off)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Project:
    """A gridbot server with volunteer pool `community` and two attached clients."""

    def __init__(self, tmp: Path, tls: bool = False, clients: int = 2) -> None:
        self.tmp = tmp
        self.vport = free_port()
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.vport}/"
        self.n_clients = clients
        (tmp / "pools.toml").write_text(f'[pools.community]\nkind = "volunteer"\nport = {self.vport}\n'
                                        'next_rpc_delay = 5\nruntime_estimate = 2\n')
        self.cluster = Cluster(tmp, server_args=("--pools", str(tmp / "pools.toml"), "--state-dir",
                                                 str(tmp / "state"), "--host-timeout", "40",
                                                 *(("--tls", "self-signed") if tls else ())))
        if tls:
            self.cluster.url = self.cluster.url.replace("http:", "https:")
        self.clients: list[BoincClient] = []
        self.keys: list[str] = []

    def start(self) -> Project:
        self.cluster.start_server()
        deadline = time.monotonic() + 30
        while not _listening(self.vport):
            assert time.monotonic() < deadline, f"no volunteer side:\n{self.cluster.server.log}"
            time.sleep(0.2)
        for name in ("alice", "bob")[:self.n_clients]:
            out = gridbot("volunteers", "add", name, "--access-file", str(self.cluster.access), cwd=self.tmp,
                          check=True)
            self.keys.append(out.stdout.strip())
        for n, key in enumerate(self.keys):
            client = BoincClient(self.tmp / f"client{n}")
            self.clients.append(client)
            if self.tls:  # the client's own CA bundle (its data folder's ca-bundle.crt, as BOINC's http_curl reads)
                shutil.copy(self.tmp / "gridbot-tls.crt", client.folder / "ca-bundle.crt")
            client.cmd("--project_attach", self.url, key)
        return self

    def stop(self) -> None:
        for c in self.clients:
            c.stop()
        self.cluster.stop()

    def logs(self) -> str:
        return "\n".join([self.cluster.server.log if self.cluster.server else "",
                          *(f"--- {c.folder.name}\n{c.text()[-6000:]}" for c in self.clients)])


def _listening(port: int) -> bool:
    import socket
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    p = Project(tmp_path_factory.mktemp("volunteer"))
    try:
        yield p.start()
    finally:
        p.stop()


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, body, {"Content-Type": "application/octet-stream", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _bag(tmp: Path, name: str, jobs: int, command: str, extra: str = "") -> Path:
    folder = tmp / name
    folder.mkdir()
    (folder / "words.txt").write_text("the quick brown fox\n")
    (folder / "bag.toml").write_text(
        f'name = "{name}"\ncommand = "{command}"\ninputs = ["words.txt"]\noutputs = ["up.txt", "n.txt"]\n'
        f'max_failures = 3\ntimeout = "2m"\n{extra}\n[parameters]\ni = {{ from = 1, to = {jobs}, step = 1 }}\n')
    return folder / "bag.toml"


def test_two_clients_run_a_bag_of_a_hundred_jobs_and_every_result_arrives(project):
    spec = _bag(project.tmp, "upper", 100, "tr a-z A-Z < words.txt > up.txt && printf %s {i} > n.txt && echo job {i}")
    gridbot("submit", str(spec), check=True)
    try:
        info = project.cluster.wait_bag("upper", timeout=400)
    except Exception:
        print(project.logs())
        raise
    assert info.state == "completed", project.logs()
    with project.cluster.client() as c:
        results = list(c.results("upper"))
        hosts = {h.host_id: h for h in c.hosts()}
    assert len(results) == 100
    for r in results:
        i = r.params["i"]
        assert r.outputs["up.txt"] == b"THE QUICK BROWN FOX\n"
        assert r.outputs["n.txt"] == i.encode()
        assert r.stdout_tail == f"job {i}\n"
        assert r.host_id is not None and r.host_id.startswith("boinc-")
    volunteers = [h for h in hosts.values() if h.pool == "community"]
    assert len(volunteers) == 2, hosts
    assert all(h.host_id.startswith("boinc-") and h.ncpus >= 1 for h in volunteers)
    assert all(h.speed > 0 and h.account.startswith("volunteer:") for h in volunteers), volunteers
    assert sum(h.done for h in volunteers) >= 100
    assert len({r.host_id for r in results}) == 2, "both clients should have run jobs"
    # the wrapper was signed with the server's key, made once, private
    key = project.tmp / "state" / "volunteer" / "code-sign-key.pem"
    assert key.stat().st_mode & 0o777 == 0o600


def test_a_client_runs_a_bag_over_https_with_the_servers_certificate(tmp_path):
    """`gridbot server --tls ...` serves its volunteer pools over HTTPS too: the account key travels in every
    scheduler request. A stock client that trusts the certificate runs a bag; plain HTTP gets nothing."""
    p = Project(tmp_path, tls=True, clients=1)
    try:
        p.start()
        spec = _bag(tmp_path, "secure", 6, "tr a-z A-Z < words.txt > up.txt && printf %s {i} > n.txt")
        gridbot("submit", str(spec), check=True)
        info = p.cluster.wait_bag("secure", timeout=300)
        assert info.state == "completed", p.logs()
        with p.cluster.client() as c:
            results = list(c.results("secure"))
        assert sorted(r.outputs["n.txt"] for r in results) == [str(i).encode() for i in range(1, 7)]
        assert all(r.outputs["up.txt"] == b"THE QUICK BROWN FOX\n" for r in results)
        assert f"https://127.0.0.1:{p.vport}/" in p.clients[0].text(), "the client spoke HTTPS"
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{p.vport}/", timeout=10).read()
    except Exception:
        print(p.logs())
        raise
    finally:
        p.stop()


def _upload(project, name: str, token: str, max_nbytes: int, data: bytes) -> tuple[int, str]:
    import hashlib
    header = (f"<data_server_request>\n<core_client_major_version>7</core_client_major_version>\n<file_upload>\n"
              f"<file_info>\n<name>{name}</name>\n<xml_signature>\n{token}\n</xml_signature>\n"
              f"<max_nbytes>{max_nbytes}</max_nbytes>\n</file_info>\n<nbytes>{len(data)}</nbytes>\n"
              f"<md5_cksum>{hashlib.md5(data).hexdigest()}</md5_cksum>\n<offset>0</offset>\n<data>\n")
    return _post(project.url + "file_upload_handler", header.encode() + data)


def test_forged_uploads_are_refused(project):
    from gridbot.volunteer.jobs import result_name
    from gridbot.volunteer.signing import Tokens

    tokens = Tokens.load_or_make(project.tmp / "state" / "volunteer")
    mine, other = f"{result_name(tokens, 9001)}_out", f"{result_name(tokens, 9002)}_out"
    limit = 1000
    good = tokens.make("upload", mine, limit)
    status, body = _upload(project, mine, "0" * 32, limit, b"x")
    assert status == 403 and "<status>-1</status>" in body and "bad upload token" in body
    status, body = _upload(project, other, good, limit, b"x")  # another result's file with this one's token
    assert status == 403 and "<status>-1</status>" in body
    status, body = _upload(project, mine, good, limit * 10, b"x")  # a larger limit than the token's
    assert status == 403
    status, body = _upload(project, mine, good, limit, b"x" * (limit + 1))  # larger than the limit
    assert status == 413 and "<status>-1</status>" in body
    header = (f"<data_server_request>\n<file_upload>\n<file_info>\n<name>{mine}</name>\n<xml_signature>\n{good}\n"
              f"</xml_signature>\n<max_nbytes>{limit}</max_nbytes>\n</file_info>\n<nbytes>-1</nbytes>\n"
              "<md5_cksum>0</md5_cksum>\n<offset>0</offset>\n<data>\n")
    status, body = _post(project.url + "file_upload_handler", header.encode())
    assert status == 400 and "a file's size is 0 or more" in body, body  # review: was "-1 bytes is over its limit"
    status, body = _upload(project, "gb1_00000000_out", good, limit, b"x")  # a name the server never made
    assert status == 403
    status, body = _post(project.url + "file_upload_handler", b"garbage")
    assert status == 400
    status, body = _upload(project, mine, good, limit, b"fine")  # the real token, but no such result is out
    assert status == 200 and "<status>-1</status>" in body and "no longer out" in body, body
    assert not list((project.tmp / "state" / "volunteer").glob(f"**/{mine}*")), "nothing kept for a result not out"


def test_bad_scheduler_requests_get_a_clear_answer(project):
    status, body = _post(project.url + "scheduler", b"\xff\xfe not xml at all")
    assert status == 400 and "bad scheduler request" in body
    status, body = _post(project.url + "scheduler", b"<scheduler_request><hostid>1</hostid></scheduler_request>")
    assert status == 400 and "authenticator" in body
    bomb = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><scheduler_request>&a;</scheduler_request>'
    status, body = _post(project.url + "scheduler", bomb)
    assert status == 400
    forged = b"<scheduler_request><authenticator>0123456789abcdef</authenticator>" \
             b"<work_req_seconds>100</work_req_seconds></scheduler_request>"
    status, body = _post(project.url + "scheduler", forged)
    assert status == 200 and "Invalid or revoked account key" in body and "<result>" not in body
    cut = b"<scheduler_request><authenticator>" + project.keys[0].encode() + b"</authenticator><hostid>x<host_info>"
    status, body = _post(project.url + "scheduler", cut)  # not well-formed: read tag by tag, answered
    assert status == 200 and "<scheduler_reply>" in body
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(project.url + "download/0000/gridbot_wrapper_102.sh", timeout=10)
    assert refused.value.code == 404
    for route in ("scheduler", "file_upload_handler"):  # found by review: a 500 and a traceback, without a key
        for encoding in ("gzip", "deflate"):
            status, body = _post(project.url + route, b"garbage", {"Content-Encoding": encoding})
            assert status == 400 and "the body cannot be read" in body, (route, encoding, status, body)
    assert "internal error" not in project.logs()


def _tasks(client: BoincClient) -> dict[str, str]:
    """The client's tasks by result name, with their process's state (EXECUTING, ABORT_PENDING, ...)."""
    out, name = {}, ""
    for line in client.cmd("--get_tasks").stdout.splitlines():
        key, _, value = line.strip().partition(": ")
        if key == "name":
            name = value
        elif key == "active_task_state" and name:
            out[name] = value
    return out


def _executing(project) -> int:
    """Task processes alive on the clients (running, or being aborted)."""
    return sum(state not in ("UNINITIALIZED", "EXITED", "ABORTED") for cl in project.clients
               for state in _tasks(cl).values())


def test_cancelled_bag_is_aborted_on_the_clients(project):
    spec = _bag(project.tmp, "slow", 8, "sleep 300; tr a-z A-Z < words.txt > up.txt; printf %s {i} > n.txt")
    gridbot("submit", str(spec), check=True)
    deadline = time.monotonic() + 120
    while _executing(project) < 2:
        assert time.monotonic() < deadline, project.logs()
        time.sleep(1)
    with project.cluster.client() as c:
        c.cancel("slow")
    deadline = time.monotonic() + 90  # each client hears of it at its next contact (next_rpc_delay: 5 s)
    while _executing(project):
        assert time.monotonic() < deadline, f"the cancelled bag's tasks still run:\n{project.logs()}"
        time.sleep(2)


def test_a_task_the_client_suspends_stops_until_it_resumes(project):
    """`boinccmd --task URL NAME suspend` (as the Manager's button, or the client making room for another
    project): the client asks through the shared memory it maps for the task, and the wrapper stops the job."""
    spec = _bag(project.tmp, "pause", 1, "i=0; while [ $i -lt 120 ]; do echo $i >> ticks; i=$((i + 1)); sleep 0.25; "
                "done; tr a-z A-Z < words.txt > up.txt; printf %s {i} > n.txt")
    gridbot("submit", str(spec), check=True)
    deadline = time.monotonic() + 120
    while True:
        found = [(cl, path) for cl in project.clients for path in cl.folder.glob("slots/*/gridbot_work/ticks")]
        running = [(cl, name) for cl, _ in found for name, state in _tasks(cl).items() if state == "EXECUTING"]
        if found and running:
            break
        assert time.monotonic() < deadline, project.logs()
        time.sleep(0.5)
    (client, ticks), (_, name) = found[0], running[0]
    assert (ticks.parent.parent / "boinc_mmap_file").exists(), "the client maps its shared memory for every task"
    client.cmd("--task", project.url, name, "suspend")
    time.sleep(3)  # the wrapper looks once a second
    frozen = ticks.read_text().count("\n")
    time.sleep(3)
    assert ticks.read_text().count("\n") == frozen < 120, "the job ran on while the client had it suspended"
    client.cmd("--task", project.url, name, "resume")
    deadline = time.monotonic() + 30
    while ticks.exists() and ticks.read_text().count("\n") == frozen:
        assert time.monotonic() < deadline, f"the job did not resume:\n{project.logs()}"
        time.sleep(0.5)
    info = project.cluster.wait_bag("pause", timeout=200)
    assert info.state == "completed", project.logs()


def test_results_a_client_lost_are_sent_again_at_once(project):
    """`other_results` lists what a client still holds: a reset client holds nothing, and the server takes its
    jobs back at its next contact, not at their deadline (the bag's is an hour here)."""
    spec = _bag(project.tmp, "reset", 2, "sleep 20; tr a-z A-Z < words.txt > up.txt && printf %s {i} > n.txt",
                '[policy]\nDeadline = "3600"\n')
    gridbot("submit", str(spec), check=True)
    from gridbot.volunteer.jobs import result_name
    from gridbot.volunteer.signing import Tokens

    tokens = Tokens.load_or_make(project.tmp / "state" / "volunteer")
    deadline = time.monotonic() + 120
    with project.cluster.client() as c:
        while True:  # the client running one of this bag's jobs
            names = {result_name(tokens, i.instance_id) for j in c.jobs("reset") for i in
                     c.instances("reset", j.job_id)}
            holders = [cl for cl in project.clients if any(_tasks(cl).get(n) == "EXECUTING" for n in names)]
            if holders:
                break
            assert time.monotonic() < deadline, project.logs()
            time.sleep(1)
    holders[0].cmd("--project", project.url, "reset")
    reset_at = time.monotonic()
    with project.cluster.client() as c:
        info = c.wait("reset", poll=1, timeout=240)
        assert info.state == "completed", project.logs()
        everything = [i for j in c.jobs("reset") for i in c.instances("reset", j.job_id)]
    # taken back at the client's next contact, long before the hour's deadline: as lost, or as never delivered
    # when the reply that sent it was the client's last (the dispatcher cannot tell; either way it runs again)
    back = [i for i in everything if i.state in ("lost", "interrupted", "failed") and i.ended_at is not None
            and i.ended_at - i.sent_at < 300]
    assert back, f"the reset client's instances were not taken back: {everything}\n{project.logs()}"
    assert len([i for i in everything if i.state == "done"]) == 2
    assert time.monotonic() - reset_at < 240


def test_a_quorum_outvotes_a_client_that_corrupts_its_outputs(project):
    """quorum = 2: each job's copies go to hosts of distinct accounts and a result counts only when two agree;
    mallory's client (the wrapper's test option) appends a line to every output, and is outvoted."""
    out = gridbot("volunteers", "add", "mallory", "--access-file", str(project.cluster.access), cwd=project.tmp,
                  check=True)
    mallory = BoincClient(project.tmp / "mallory", env={"GRIDBOT_WRAPPER_CORRUPT_OUTPUTS": "1"})
    try:
        mallory.cmd("--project_attach", project.url, out.stdout.strip())
        spec = _bag(project.tmp, "voted", 12, "sleep 1; tr a-z A-Z < words.txt > up.txt && printf %s {i} > n.txt",
                    "quorum = 2\nmax_instances = 6\n")
        gridbot("submit", str(spec), check=True)
        with project.cluster.client() as c:
            info = c.wait("voted", poll=1, timeout=400)
            assert info.state == "completed", project.logs() + mallory.text()[-4000:]
            results = list(c.results("voted"))
            stories = [c.story("voted", i) for i in range(12)]
        hosts = {h["volunteer"]: h["host_id"] for h in gridbot_json("volunteers", "hosts", "--state-dir",
                                                                    str(project.tmp / "state"), "--access-file",
                                                                    str(project.cluster.access), cwd=project.tmp)}
        assert len(results) == 12
        assert all(r.outputs["up.txt"] == b"THE QUICK BROWN FOX\n" for r in results), "a corrupt result was kept"
        assert all(r.host_id != hosts["mallory"] for r in results)
        invalid = [d for s in stories for d in s.decisions if d.action == "invalid"]
        mallorys = [i for s in stories for i in s.instances if i.host_id == hosts["mallory"] and i.state == "done"]
        assert mallorys, "mallory's client ran no job of the bag"
        assert len(invalid) >= len(mallorys), (invalid, mallorys)
    finally:
        mallory.cmd("--project", project.url, "detach", check=False)
        mallory.stop()


def test_a_killed_clients_jobs_run_elsewhere(project):
    spec = _bag(project.tmp, "lost", 6, "sleep 8; tr a-z A-Z < words.txt > up.txt && printf %s {i} > n.txt")
    gridbot("submit", str(spec), check=True)
    deadline = time.monotonic() + 120
    with project.cluster.client() as c:
        # whichever client took the jobs (the first to ask may take them all: each holds up to its Concurrency)
        while not (busy := [cl for cl in project.clients if "EXECUTING" in cl.cmd("--get_tasks").stdout]):
            assert time.monotonic() < deadline, project.logs()
            time.sleep(1)
        busy[0].kill()
        info = c.wait("lost", poll=1, timeout=300)
        assert info.state == "completed", project.logs()
        results = list(c.results("lost"))
        jobs = c.jobs("lost")
    assert len(results) == 6
    assert all(r.outputs["up.txt"] == b"THE QUICK BROWN FOX\n" for r in results)
    assert sum(j.attempts for j in jobs) > 6, "the killed client's jobs were sent again"
