"""Issue 11: nobody runs a command on our workers without a key. Real `gridbot server` and workers."""

from __future__ import annotations

import json
import os
import re
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest

from gridbot.client import ApiError, Client
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import BagSpec
from gridbot.protocol import ExchangeRequest, ExchangeResponse, SubmitRequest
from gridbot.security.access import Access, read_access, write_access
from gridbot.security.keys import ENROLLMENT_TTL, AccessError, Authenticator, load_registry
from gridbot.server.app import PERMISSIONS, Server
from gridbot.server.console import PUBLIC
from gridbot.server.service import Service
from gridbot.store.memory import MemoryStore
from tests.integration.harness import Cluster, gridbot, gridbot_json

MP = "application/msgpack"


def _call(url: str, method: str, path: str, token: str | None, body: bytes | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": MP, "Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=body if method == "POST" else None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {}
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw.startswith(b"{") else {})


def _exchange(url: str, credential: str, req: ExchangeRequest) -> tuple[int, ExchangeResponse | None]:
    request = urllib.request.Request(f"{url}/v1/exchange", msgspec.msgpack.encode(req), method="POST",
                                     headers={"Content-Type": MP, "Authorization": f"Bearer {credential}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, msgspec.msgpack.decode(r.read(), type=ExchangeResponse)
    except urllib.error.HTTPError as e:
        return e.code, None


def _routes() -> list[tuple[str, str]]:
    """Every route of the application, from the app itself (a new endpoint is in this list by itself)."""
    app = Server(Service(MemoryStore())).app
    out = []
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        out.append((route.method, route.resource.canonical))
    return sorted(set(out))


def test_every_route_has_a_permission_entry():
    routes = _routes()
    assert len(routes) >= 15
    missing = [r for r in routes if r not in PERMISSIONS]
    assert not missing, f"routes without a permission entry (refused to everyone, but say who may use them): {missing}"


def test_every_route_refuses_requests_without_a_key_and_with_the_wrong_role(cluster, tmp_path):
    cluster.start_server()
    (tmp_path / "s.toml").write_text('name = "s"\ncommand = "true"\ninputs = ["in.txt"]\n')
    (tmp_path / "in.txt").write_text("x")
    with cluster.client() as c:
        c.submit_file(tmp_path / "s.toml")
    grants = read_access(cluster.access)
    _, host_credential = cluster.register()
    tokens = {"admin": grants.admin, "submitter": grants.submitter, "worker": grants.workers["local"],
              "host": host_credential}
    checked = 0
    for method, canonical in _routes():
        if (method, canonical) in PUBLIC:  # the console's shell: package files, no data (test_console.py)
            continue
        path = canonical.replace("{bag}", "s").replace("{job}", "1").replace("{name}", "in.txt")
        for token in (None, "", "gb1.nope.nope", grants.admin[:-2] + "xx", host_credential[:-2] + "00"):
            code, body = _call(cluster.url, method, path, token, b"")
            assert code == 401, (method, path, token, code, body)
            assert "valid key" in body.get("error", ""), body
        for role, token in tokens.items():
            if role in PERMISSIONS[(method, canonical)]:
                continue
            code, body = _call(cluster.url, method, path, token, b"")
            assert code == 403, (method, path, role, code, body)
            assert body["error"].startswith(f"{'an' if role == 'admin' else 'a'} {role} key may not {method} "), body
            assert token not in json.dumps(body), "a key never appears in an answer"
            checked += 1
    assert checked > 20
    assert grants.admin not in (cluster.server.log if cluster.server else ""), "no key in the server's log"


def test_the_access_file_is_private_and_the_registry_holds_no_secret(cluster):
    cluster.start_server()
    assert stat.S_IMODE(cluster.access.stat().st_mode) == 0o600
    registry = (cluster.access.parent / "gridbot-keys.json")
    assert stat.S_IMODE(registry.stat().st_mode) == 0o600
    grants = read_access(cluster.access)
    text = registry.read_text()
    for token in (grants.admin, grants.submitter, *grants.workers.values()):
        assert token.split(".")[2] not in text, "the server keeps only digests of the keys"
    os.chmod(cluster.access, 0o644)
    with pytest.raises(AccessError, match="chmod 600"):
        read_access(cluster.access)
    os.chmod(cluster.access, 0o600)


def test_a_forged_report_for_another_hosts_instance_changes_nothing_and_is_counted(cluster, tmp_path):
    cluster.start_server()
    (tmp_path / "s.toml").write_text('name = "s"\ncommand = "true"\n')
    with cluster.client() as c:
        c.submit_file(tmp_path / "s.toml")
    a_id, a_cred = cluster.register()
    b_id, b_cred = cluster.register()
    assert a_id != b_id
    code, resp = _exchange(cluster.url, a_cred, ExchangeRequest(HostInfo(a_id, "a"), 1, []))
    assert code == 200 and resp is not None and len(resp.assignments) == 1
    iid = resp.assignments[0].instance_id
    # host B claims to be host A: refused outright
    code, _ = _exchange(cluster.url, b_cred, ExchangeRequest(HostInfo(a_id, "a"), 0, [iid],
                                                                [InstanceReport(iid, Outcome.FAILURE, 1)]))
    assert code == 403
    # host B reports A's instance as its own: ignored and counted
    forged = InstanceReport(iid, Outcome.FAILURE, 1, reason="forged")
    for _ in range(3):
        code, _ = _exchange(cluster.url, b_cred, ExchangeRequest(HostInfo(b_id, "b"), 0, [], [forged]))
        assert code == 200
    with cluster.client() as c:
        assert c.bag("s").counts.failed == 0 and c.bag("s").counts.running == 1
    real = InstanceReport(iid, Outcome.SUCCESS, 0, stdout_tail="real")
    code, _ = _exchange(cluster.url, a_cred, ExchangeRequest(HostInfo(a_id, "a"), 0, [], [real]))
    assert code == 200
    with cluster.client() as c:
        info = c.bag("s")
        assert info.state == "completed" and info.counts.done == 1
        assert next(c.results("s")).stdout_tail == "real", "the real result is kept"
    hosts = {h["host_id"]: h for h in gridbot_json("hosts")}
    assert hosts[b_id]["refused"] == 3 and hosts[a_id]["refused"] == 0
    assert "REFUSED" in gridbot("hosts").stdout


def test_two_submitters_see_only_their_own_bags_and_the_admin_sees_all(cluster, tmp_path):
    cluster.start_server()
    bob = tmp_path / "bob.json"
    out = gridbot("access", "add-submitter", "bob", "--out", str(bob), "--access-file", str(cluster.access))
    assert out.returncode == 0, out.stderr
    (tmp_path / "a.toml").write_text('name = "alice-bag"\ncommand = "true"\n')
    (tmp_path / "b.toml").write_text('name = "bob-bag"\ncommand = "true"\n')
    with cluster.client() as alice, Client(cluster.url, access=bob) as b, cluster.client(admin=True) as admin:
        alice.submit_file(tmp_path / "a.toml")
        b.submit_file(tmp_path / "b.toml")
        assert [x.name for x in alice.bags()] == ["alice-bag"]
        assert [x.name for x in b.bags()] == ["bob-bag"]
        assert sorted(x.name for x in admin.bags()) == ["alice-bag", "bob-bag"]
        for call in (lambda: b.bag("alice-bag"), lambda: b.cancel("alice-bag"), lambda: b.jobs("alice-bag"),
                     lambda: b.set_policy("alice-bag", "Rank", "1"), lambda: list(b.results("alice-bag")),
                     lambda: b.policy("alice-bag"), lambda: b.bag(1), lambda: b.instances("alice-bag", 1),
                     lambda: b.wait("alice-bag", timeout=5)):
            with pytest.raises(ApiError) as err:
                call()
            assert (err.value.status == 404 and "alice-bag" not in str(err.value)) or "no bag" in str(err.value)
        assert alice.bag("alice-bag").state == "active", "bob's cancel changed nothing"
        assert admin.cancel("bob-bag").state == "cancelled"
    proc = gridbot("status", "--access", str(bob), "--json")
    assert [x["name"] for x in json.loads(proc.stdout)] == ["bob-bag"]


def _register(url: str, token: str) -> tuple[int, str]:
    """POST /v1/register with `token`: (status, the credential or the error's text)."""
    from gridbot.protocol import RegisterRequest, Registration

    req = urllib.request.Request(f"{url}/v1/register", msgspec.msgpack.encode(RegisterRequest("pilot")),
                                 {"Authorization": f"Bearer {token}", "Content-Type": MP, "Accept": MP})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, msgspec.msgpack.decode(r.read(), type=Registration).credential
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_an_enrollment_token_registers_the_hosts_it_was_made_for_and_no_more(cluster):
    """An EC2 pilot's jobs can read its user data from the instance's metadata service: the overlay gives such
    pilots a token for their own hosts, which their workers spend before any job runs, not the pool's key."""
    cluster.start_server()
    registry = load_registry(cluster.access.parent / "gridbot-keys.json")
    auth = Authenticator(registry)
    key = read_access(cluster.access).workers["local"]
    token = auth.enrollment(key, 2, time.time())
    assert key.split(".")[2] not in token, "the pool's key is not in the token"
    first, second, third = (_register(cluster.url, token) for _ in range(3))
    assert first[0] == second[0] == 200 and first[1] != second[1]
    assert third[0] == 401 and "registered the 2 host(s) it was made for" in third[1], third
    code, _ = _call(cluster.url, "GET", "/v1/bags", token)
    assert code == 403, "an enrollment token may register hosts, nothing else"
    late = auth.enrollment(key, 1, time.time() - ENROLLMENT_TTL - 1)
    forged = token.rsplit(".", 2)[0] + ".9999999999." + token.rsplit(".", 1)[1]  # (a later expiry, same MAC)
    more = token.replace(".2.", ".9.", 1)
    odd = token.replace(".2.", ".\u00b2.", 1)  # (a digit to str.isdigit, not to int)
    for bad in (late, forged, more, odd):
        assert _register(cluster.url, bad)[0] == 401, bad
    # found by the review: a MAC or secret that is not ASCII made compare_digest (or encode) raise, a 500 with
    # a logged traceback, for anyone who knew a key id (every host credential shows one)
    kid = key.split(".")[1]
    for bad in (f"gbe.{kid}.n.1.99.\u00e9aaa", f"gbh.{kid}.x.\u00e9", f"gb1.{kid}.\u00ff"):
        assert _register(cluster.url, bad)[0] == 401, bad
    spent = auth.authenticate(token)
    expired = msgspec.structs.replace(spent, enrollment="other", expires=time.time() - 1)
    assert spent is not None and not auth.enroll(expired, time.time(), MemoryStore().spend_enrollment)
    # the MAC of an enrollment token is no host credential's for any host id
    parts = token.split(".")
    assert _exchange(cluster.url, f"gbh.{parts[1]}.{':'.join(parts[2:5])}.{parts[5]}",
                     ExchangeRequest(HostInfo("x", "x"), 1, []))[0] == 401
    out = gridbot("access", "revoke", "--pool", "local", "--access-file", str(cluster.access))
    assert out.returncode == 0, out.stderr
    time.sleep(1.2)  # (the server re-reads its registry at most once a second)
    fresh = auth.enrollment(key, 1, time.time())
    assert _register(cluster.url, fresh)[0] == 401, "revoking the pool's key revokes its tokens"


def test_a_spent_enrollment_token_stays_spent_across_a_restart(cluster):
    """The server counted a token's uses in memory: restarted within the token's hour, it took a spent token
    for a fresh one, and a job that had read it from the instance's user data could register a host."""
    cluster.start_server()
    auth = Authenticator(load_registry(cluster.access.parent / "gridbot-keys.json"))
    token = auth.enrollment(read_access(cluster.access).workers["local"], 1, time.time())
    assert _register(cluster.url, token)[0] == 200
    assert _register(cluster.url, token)[0] == 401
    cluster.server.stop()
    cluster.start_server()
    code, text = _register(cluster.url, token)
    assert code == 401 and "registered the 1 host(s) it was made for" in text, (code, text)
    fresh = auth.enrollment(read_access(cluster.access).workers["local"], 1, time.time())
    assert _register(cluster.url, fresh)[0] == 200, "the other tokens are untouched"


def test_a_revoked_worker_key_stops_its_hosts_at_their_next_exchange(cluster, tmp_path):
    cluster.start_server()
    w = cluster.start_worker("--slots", "1", "--idle-timeout", "0")
    (tmp_path / "a.toml").write_text('name = "a"\ncommand = "true"\n[parameters]\ni = [1, 2, 3]\n')
    with cluster.client() as c:
        c.submit_file(tmp_path / "a.toml")
        assert cluster.wait_bag("a", timeout=60).counts.done == 3
        out = gridbot("access", "revoke", "--pool", "local", "--access-file", str(cluster.access))
        assert out.returncode == 0 and "revoked worker key" in out.stdout, out.stderr
        (tmp_path / "b.toml").write_text('name = "b"\ncommand = "true"\n')
        c.submit_file(tmp_path / "b.toml")
        assert w.wait(30) == 1, "the worker stops when its credential is refused"
        assert "refused" in w.log
        assert c.bag("b").counts.done == 0 and c.bag("b").counts.running == 0
    again = cluster.start_worker("--slots", "1")
    assert again.wait(30) != 0, "a new worker with the revoked key cannot register"
    assert "gridbot access rotate worker --pool local" in out.stdout
    # found by the walkthrough review of 2026-11-29: no command gave the pool a key again, short of a restart
    out = gridbot("access", "rotate", "worker", "--pool", "local", "--access-file", str(cluster.access))
    assert out.returncode == 0 and "worker of pool local" in out.stdout, out.stdout + out.stderr
    wrong = gridbot("access", "rotate", "worker", "--pool", "nope", "--access-file", str(cluster.access))
    assert wrong.returncode != 0 and "the pools with worker keys: local" in wrong.stderr, wrong.stderr
    time.sleep(1.2)  # the server re-reads its registry at most once a second
    back = cluster.start_worker("--slots", "1")
    (tmp_path / "c.toml").write_text('name = "c"\ncommand = "true"\n')
    with cluster.client() as c:
        c.submit_file(tmp_path / "c.toml")
    assert cluster.wait_bag("c", timeout=60).counts.done == 1
    back.stop()


def test_rotation_gives_new_keys_and_refuses_the_old(cluster):
    cluster.start_server()
    old = read_access(cluster.access)
    out = gridbot("access", "rotate", "submitter", "--access-file", str(cluster.access))
    assert out.returncode == 0, out.stderr
    new = read_access(cluster.access)
    assert new.submitter != old.submitter and new.admin == old.admin
    time.sleep(1.2)  # the server re-reads its registry at most once a second
    assert _call(cluster.url, "GET", "/v1/bags", old.submitter)[0] == 401
    assert _call(cluster.url, "GET", "/v1/bags", new.submitter)[0] == 200
    shown = gridbot_json("access", "show", "--access-file", str(cluster.access))
    assert sum(1 for k in shown if k["role"] == "submitter" and k["revoked"]) == 1
    # a review of 2026-11-29: the access file's submitter key revoked by id could not be made again
    key_id = new.submitter.split(".")[1]
    out = gridbot("access", "revoke", key_id, "--access-file", str(cluster.access))
    assert out.returncode == 0 and "gridbot access rotate submitter" in out.stdout, out.stdout + out.stderr
    assert read_access(cluster.access).submitter == ""
    owner = next(k["name"] for k in shown if k["role"] == "submitter")
    someone = {"USER": "someone", "LOGNAME": "someone", "LNAME": "someone", "USERNAME": "someone"}
    out = gridbot("access", "rotate", "submitter", "--access-file", str(cluster.access), env=someone)
    assert out.returncode == 0 and f"submitter {owner}" in out.stdout, out.stdout + out.stderr  # not "someone"
    again = read_access(cluster.access).submitter
    time.sleep(1.2)
    assert _call(cluster.url, "GET", "/v1/bags", again)[0] == 200
    assert _call(cluster.url, "GET", "/v1/bags", new.submitter)[0] == 401


def test_a_server_without_keys_may_listen_on_loopback_only(tmp_path):
    proc = gridbot("server", "--db", f"sqlite:///{tmp_path}/x.db", "--host", "0.0.0.0", "--no-auth", "--port", "0",
                   timeout=30)
    assert proc.returncode == 2
    assert "--no-auth with --host 0.0.0.0" in proc.stderr and "drop --no-auth" in proc.stderr
    assert not (tmp_path / "x.db").exists(), "nothing was started"


def test_output_names_that_escape_or_are_reserved_are_refused_by_the_server(cluster, tmp_path):
    cluster.start_server()
    grants = read_access(cluster.access)
    for bad in ("../x", "/etc/x", "stdout", "a/../../b", ""):
        body = msgspec.msgpack.encode(SubmitRequest(BagSpec(name="o", command="true", outputs=[bad])))
        code, answer = _call(cluster.url, "POST", "/v1/bags", grants.submitter, body)
        assert code == 400, (bad, code, answer)
        assert "output" in answer["error"]
    for bad_name in ("", "../../etc", "a/b", "x" * 100_000):
        body = msgspec.msgpack.encode(SubmitRequest(BagSpec(name=bad_name, command="true")))
        code, answer = _call(cluster.url, "POST", "/v1/bags", grants.submitter, body)
        assert code in (400, 413), (bad_name[:20], code)
    with cluster.client(admin=True) as c:
        assert c.bags() == [], "nothing was stored"


def test_a_host_cannot_return_outputs_its_bag_did_not_declare(cluster, tmp_path):
    cluster.start_server()
    (tmp_path / "s.toml").write_text('name = "s"\ncommand = "true"\noutputs = ["o.txt"]\nmax_failures = 1\n')
    with cluster.client() as c:
        c.submit_file(tmp_path / "s.toml")
    host_id, cred = cluster.register()
    _, resp = _exchange(cluster.url, cred, ExchangeRequest(HostInfo(host_id, "h"), 1, []))
    assert resp is not None
    iid = resp.assignments[0].instance_id
    report = InstanceReport(iid, Outcome.SUCCESS, 0, outputs={"o.txt": b"ok", "../../evil": b"x"})
    assert _exchange(cluster.url, cred, ExchangeRequest(HostInfo(host_id, "h"), 0, [], [report]))[0] == 200
    with cluster.client() as c:
        job = c.jobs("s")[0]
    assert job.state == "failed" and "did not declare" in (job.reason or "")


def test_a_host_cannot_report_success_without_a_declared_output(cluster, tmp_path):
    """Found by the API review of 2026-12-07: the server refused outputs a bag did not declare but took a success
    that lacked a declared one, and the job was done with nothing to show for it (the worker and the volunteer side
    fail such a job themselves; the server does not take a host's word for it)."""
    cluster.start_server()
    (tmp_path / "s.toml").write_text('name = "s"\ncommand = "true"\noutputs = ["o.txt", "p_{i}.txt"]\n'
                                     'max_failures = 1\n[parameters]\ni = [1, 2, 3]\n')
    with cluster.client() as c:
        c.submit_file(tmp_path / "s.toml")
    host_id, cred = cluster.register()
    host = HostInfo(host_id, "h", ncpus=3, slots=3)
    _, resp = _exchange(cluster.url, cred, ExchangeRequest(host, 3, []))
    assert resp is not None and len(resp.assignments) == 3
    first, second, third = sorted(resp.assignments, key=lambda a: a.job_id)
    reports = [InstanceReport(first.instance_id, Outcome.SUCCESS, 0, outputs={"o.txt": b"ok"}),
               InstanceReport(second.instance_id, Outcome.SUCCESS, 0),
               InstanceReport(third.instance_id, Outcome.SUCCESS, 0, outputs={"o.txt": b"ok", "p_3.txt": b"3"})]
    assert _exchange(cluster.url, cred, ExchangeRequest(host, 0, [], reports))[0] == 200
    with cluster.client() as c:
        jobs = sorted(c.jobs("s"), key=lambda j: j.index)
    assert [j.state for j in jobs] == ["failed", "failed", "done"], jobs
    assert "without the declared output 'p_1.txt'" in (jobs[0].reason or ""), jobs[0].reason
    assert "without the declared output 'o.txt' and 1 more" in (jobs[1].reason or ""), jobs[1].reason


def test_pilots_get_their_pools_worker_key_in_the_environment_not_on_the_command_line(tmp_path):
    from gridbot.model.pools import PoolSpec
    from gridbot.pools.adapters import LocalAdapter
    from gridbot.pools.base import PilotRequest

    pool = LocalAdapter(PoolSpec("p", "local", max_running=1, walltime=0, idle_timeout=1, min_cpu=0, allow_root=True),
                        tmp_path)
    key = "gb1.abcdef.secret-worker-key"
    try:
        (pid,) = [int(i.removeprefix("local-")) for i in pool.submit(1, PilotRequest("http://127.0.0.1:9", key=key))]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"secret-worker-key" not in cmdline
        assert b"GRIDBOT_WORKER_KEY=" + key.encode() in environ
    finally:
        pool.stop()


def test_a_worker_pins_the_servers_certificate(tmp_path):
    cluster = Cluster(tmp_path, server_args=("--tls", "self-signed"))
    cluster.url = cluster.url.replace("http:", "https:")
    try:
        cluster.start_server()
        grants = read_access(cluster.access)
        assert grants.fingerprint.startswith("sha256:") and grants.server.startswith("https://")
        (tmp_path / "s.toml").write_text('name = "s"\ncommand = "echo hi"\n[parameters]\ni = [1, 2]\n')
        with cluster.client() as c:
            c.submit_file(tmp_path / "s.toml")
        cluster.start_worker("--slots", "1")
        assert cluster.wait_bag("s", timeout=60).counts.done == 2, "a worker with the right pin works"
        wrong = tmp_path / "wrong.json"
        write_access(wrong, msgspec.structs.replace(grants, fingerprint="sha256:" + "ab" * 32))
        with Client(cluster.url, access=wrong) as c, pytest.raises(AccessError, match="not the pinned"):
            c.bags()
        for w in cluster.workers:
            w.stop()
        (tmp_path / "t.toml").write_text('name = "t"\ncommand = "true"\n')
        with cluster.client() as c:
            c.submit_file(tmp_path / "t.toml")
        impostor = cluster.start_worker("--slots", "1", "--access", str(wrong), "--give-up-after", "3")
        impostor.wait(60)
        assert re.search(r"fingerprint|certificate", impostor.log), impostor.log[-2000:]
        with cluster.client() as c:
            assert c.bag("t").counts.done == 0
    finally:
        cluster.stop()


def test_access_files_handed_out_carry_only_what_they_grant(cluster, tmp_path):
    cluster.start_server()
    out = tmp_path / "w.json"
    assert gridbot("access", "export-worker", "local", "--out", str(out), "--access-file",
                   str(cluster.access)).returncode == 0
    w = read_access(out)
    assert w == Access(server=w.server, workers={"local": read_access(cluster.access).workers["local"]})
    code, _ = _call(cluster.url, "GET", "/v1/bags", w.workers["local"])
    assert code == 403
