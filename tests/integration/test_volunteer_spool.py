"""The volunteer pool's job files and uploads live in its spool (volunteer/jobs.Spool), not a file each: they
must outlive a restart of the server as the files did. A real gridbot server, spoken to in the stock client's
protocol by hand (the real client is in test_volunteer.py), restarted between a job file being sent and
fetched, and between a result's upload and its report."""

from __future__ import annotations

import hashlib
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.integration.harness import Cluster, free_port, gridbot


def _request(key: str, hostid: int, reports: list[str], want: bool = True) -> bytes:
    results = "".join(f"<result><name>{n}</name><state>5</state><exit_status>0</exit_status>"
                      "<final_cpu_time>0.5</final_cpu_time><final_elapsed_time>0.5</final_elapsed_time>"
                      "<stderr_out></stderr_out></result>\n" for n in reports)
    return (f"<scheduler_request>\n<authenticator>{key}</authenticator>\n<hostid>{hostid}</hostid>\n"
            "<platform_name>x86_64-pc-linux-gnu</platform_name>\n"
            f"<work_req_seconds>{1000 if want else 0}</work_req_seconds>\n<cpu_req_instances>{2 if want else 0}"
            "</cpu_req_instances>\n<host_info><host_cpid>spooltest</host_cpid><domain_name>sim</domain_name>"
            f"<p_ncpus>2</p_ncpus><p_fpops>1e9</p_fpops></host_info>\n{results}<other_results></other_results>\n"
            "</scheduler_request>\n").encode()


def _http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers or {}), timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _result_file(stdout: bytes, output: bytes) -> bytes:
    return (b"gridbot-result 1\nstatus 0\nfile stdout %d\n%s\nfile stderr 0\n\nfile 0 %d\n%s\nend\n"
            % (len(stdout), stdout, len(output), output))


def _upload(url: str, name: str, token: str, limit: str, data: bytes) -> bytes:
    header = (f"<data_server_request>\n<file_upload>\n<file_info>\n<name>{name}</name>\n<xml_signature>\n{token}\n"
              f"</xml_signature>\n<max_nbytes>{limit}</max_nbytes>\n</file_info>\n<nbytes>{len(data)}</nbytes>\n"
              f"<md5_cksum>{hashlib.md5(data).hexdigest()}</md5_cksum>\n<offset>0</offset>\n<data>\n")
    status, body = _http(url + "file_upload_handler", header.encode() + data)
    assert status == 200, body
    return body


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            assert time.monotonic() < deadline, "the volunteer side did not listen"
            time.sleep(0.2)


def test_job_files_and_uploads_outlive_a_restart(tmp_path: Path) -> None:
    vport = free_port()
    url = f"http://127.0.0.1:{vport}/"
    (tmp_path / "pools.toml").write_text(f'[pools.community]\nkind = "volunteer"\nport = {vport}\n'
                                         "runtime_estimate = 1\n")
    (tmp_path / "bag.toml").write_text('name = "b"\ncommand = "echo {i} > n.txt"\noutputs = ["n.txt"]\n'
                                       "[parameters]\ni = { from = 1, to = 2 }\n")
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"), "--state-dir",
                                             str(tmp_path / "state")))
    cluster.cancel_pilots = False
    try:
        cluster.start_server()
        _wait_listening(vport)
        key = gridbot("volunteers", "add", "alice", "--access-file", str(cluster.access), cwd=tmp_path,
                      check=True).stdout.strip()
        gridbot("submit", str(tmp_path / "bag.toml"), check=True)
        status, reply = _http(url + "scheduler", _request(key, 0, []))
        text = reply.decode()
        assert status == 200, text
        hostid = int(re.search(r"<hostid>(\d+)</hostid>", text).group(1))  # type: ignore[union-attr]
        jobs = re.findall(r"<url>http://[^/<]+/(download/[0-9a-f]+/(gb\d+_[0-9a-f]+)_job)</url>", text)
        uploads = re.findall(r"<name>(gb\d+_[0-9a-f]+_out)</name>\s*<upload_url>[^<]*</upload_url>\s*<max_nbytes>"
                             r"(\d+)</max_nbytes>\s*<xml_signature>\s*([0-9a-f]+)\s*</xml_signature>", text)
        assert len(jobs) == 2 and len(uploads) == 2, text
        (path_a, result_a), (path_b, result_b) = jobs
        tokens = {name[:-len("_out")]: (name, limit, token) for name, limit, token in uploads}
        status, job_a = _http(url + path_a)
        assert status == 200
        i_a = re.search(rb"echo (\d) > n.txt", job_a).group(1)  # type: ignore[union-attr]
        assert not list((tmp_path / "state").glob(f"**/{result_a}*")), "no file of its own per instance"
        name, limit, token = tokens[result_a]
        assert b"<status>0</status>" in _upload(url, name, token, limit, _result_file(b"job " + i_a, i_a))

        cluster.server.stop()  # type: ignore[union-attr]
        cluster.start_server()
        _wait_listening(vport)

        status, job_b = _http(url + path_b)  # sent before the restart, fetched after it
        assert status == 200
        i_b = re.search(rb"echo (\d) > n.txt", job_b).group(1)  # type: ignore[union-attr]
        assert {i_a, i_b} == {b"1", b"2"}
        status, rest = _http(url + path_b, headers={"Range": "bytes=3-"})  # a resumed download
        assert status == 206 and rest == job_b[3:]
        assert _http(url + path_b, headers={"Range": f"bytes={len(job_b)}-"})[0] == 416
        assert _http(url + path_b, headers={"Range": "bytes=abc"})[0] == 416  # unreadable: refused, not a 500
        assert _http(url + path_b, headers={"Range": "bytes=-0"})[0] == 416  # the last 0 bytes (review: was 206)
        status, tail = _http(url + path_b, headers={"Range": "bytes=-4"})
        assert status == 206 and tail == job_b[-4:]
        assert _http(url + path_b.replace("download/", "download/0", 1))[0] == 404  # a token not the server's
        name, limit, token = tokens[result_b]
        assert b"<status>0</status>" in _upload(url, name, token, limit, _result_file(b"job " + i_b, i_b))
        status, reply = _http(url + "scheduler", _request(key, hostid, [result_a, result_b], want=False))
        assert status == 200, reply
        info = cluster.wait_bag("b", timeout=60)
        assert info.state == "completed", cluster.server.log  # type: ignore[union-attr, attr-defined]
        with cluster.client() as c:
            results = {r.params["i"]: r for r in c.results("b")}
        assert {str(i): (r.stdout_tail, r.outputs["n.txt"]) for i, r in results.items()} == {
            "1": ("job 1", b"1"), "2": ("job 2", b"2")}, "the upload made before the restart was read after it"
    finally:
        cluster.stop()


def test_accounts_added_beside_the_access_file_count_when_the_key_registry_is_elsewhere(tmp_path: Path) -> None:
    """Found by the docs review of 2026-11-29: the server read the accounts beside its key registry, and `gridbot
    volunteers add` wrote them beside the access file, so with `--keys-file` elsewhere no account ever counted."""
    vport = free_port()
    (tmp_path / "pools.toml").write_text(f'[pools.community]\nkind = "volunteer"\nport = {vport}\n')
    (tmp_path / "keys").mkdir()
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"), "--state-dir",
                                             str(tmp_path / "state"), "--keys-file",
                                             str(tmp_path / "keys" / "gridbot-keys.json")))
    try:
        cluster.start_server()
        _wait_listening(vport)
        accounts = tmp_path / "gridbot-volunteers.json"
        assert f"volunteer accounts: {accounts}" in cluster.server.log  # type: ignore[union-attr]
        key = gridbot("volunteers", "add", "alice", "--access-file", str(cluster.access), cwd=tmp_path,
                      check=True).stdout.strip()
        assert accounts.is_file() and (tmp_path / "keys" / "gridbot-keys.json").is_file()
        deadline = time.monotonic() + 10  # the server re-reads the file within a second of its change
        while True:
            status, reply = _http(f"http://127.0.0.1:{vport}/scheduler", _request(key, 0, [], want=False))
            if b"<hostid>" in reply or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert status == 200 and b"<hostid>" in reply, reply.decode()
    finally:
        cluster.stop()
