"""Job isolation on the worker (issue "security"): real servers, real workers, real processes.

A job's processes die with it, even those that left its session, and with its worker, even one killed
by SIGKILL; a job sees only the environment it is given; a job over its memory limit fails saying so;
a job cannot change another bag's cached input; a worker started as root runs jobs as `--run-as`.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gridbot.errors import UsageError
from gridbot.worker.inputs import InputCache
from gridbot.worker.isolation import job_environment, new_token, resolve_user
from gridbot.worker.reaper import start_watchdog
from tests.integration.harness import Cluster, gridbot, gridbot_json

ROOT = os.geteuid() == 0


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def processes(prefix: str) -> list[int]:
    """Live (not zombie) processes whose command line starts with `prefix`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if cmdline.startswith(prefix) and state != "Z":
            found.append(int(name))
    return found


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"after {timeout:g} s: {what}")


def submit(cluster: Cluster, tmp_path: Path, name: str, text: str) -> None:
    gridbot_json("submit", write(tmp_path, f"{name}.toml", f'name = "{name}"\n{text}'), "--server", cluster.url)


def only_job(cluster: Cluster, bag: str) -> dict:
    [job] = gridbot_json("jobs", bag, "--server", cluster.url)
    return job


def test_a_detached_process_dies_when_its_job_times_out(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "1")
    submit(cluster, tmp_path, "t", 'command = "setsid sleep 1000.101 & sleep 1000.102"\ntimeout = "2s"\n'
                                   "max_failures = 1\n")
    [escaped] = wait_for(lambda: processes("sleep 1000.101"), 20, "the job never started")
    assert os.getsid(escaped) == escaped, "it left the job's session"
    assert cluster.wait_bag("t", timeout=30).state == "failed"
    assert "timed out after 2 s" in only_job(cluster, "t")["reason"]
    wait_for(lambda: not processes("sleep 1000.10"), 5, "a process of the timed-out job still runs")


def test_a_detached_process_dies_with_its_worker_killed_by_sigkill(cluster, tmp_path):
    cluster.start_server()
    worker = cluster.start_worker("--slots", "1")
    submit(cluster, tmp_path, "k", 'command = "setsid sleep 1000.201 & sleep 1000.202"\n')
    wait_for(lambda: processes("sleep 1000.201") and processes("sleep 1000.202"), 20, "the job never started")
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    wait_for(lambda: not processes("sleep 1000.20"), 5, "the job outlived its worker")


def test_a_job_sees_only_the_environment_it_is_given(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDBOT_TEST_SECRET", "s3cret")
    monkeypatch.setenv("GRIDBOT_TEST_PASSED", "handed-on")
    cluster.start_server()
    cluster.start_worker("--slots", "1", "--pass-env", "GRIDBOT_TEST_PASSED")
    submit(cluster, tmp_path, "e", 'command = "env"\n[env]\nMINE = "from-the-spec"\n')
    assert cluster.wait_bag("e").state == "completed"
    with cluster.client() as c:
        [result] = list(c.results("e"))
    env = dict(line.split("=", 1) for line in result.stdout_tail.splitlines() if "=" in line)
    assert "GRIDBOT_TEST_SECRET" not in env, "only in the worker's environment"
    assert env["GRIDBOT_TEST_PASSED"] == "handed-on" and env["MINE"] == "from-the-spec"
    assert env["PATH"] == os.environ["PATH"] and env["GRIDBOT_BAG"] == "e"
    assert set(env) - {"MINE", "GRIDBOT_TEST_PASSED", "PWD", "SHLVL", "_"} <= {
        "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "USER", "LOGNAME", "TZ", "SHELL", "GRIDBOT_RUN",
        "GRIDBOT_JOB_INDEX", "GRIDBOT_JOB_ID", "GRIDBOT_INSTANCE", "GRIDBOT_BAG", "GRIDBOT_CPUS"}, sorted(env)


def test_the_base_environment_is_an_allow_list():
    env = job_environment(("EXTRA",), "tok", None, {"PATH": "/bin", "HOME": "/h", "AWS_SECRET_ACCESS_KEY": "x",
                                                    "GRIDBOT_WORKER_KEY": "k", "EXTRA": "1"})
    assert env == {"PATH": "/bin", "HOME": "/h", "EXTRA": "1", "GRIDBOT_RUN": "tok"}


def test_a_run_as_users_path_keeps_only_the_folders_it_can_search():
    """Found by the walkthrough review of 2026-11-29: a root worker's PATH (/root/.cargo/bin first) went to jobs
    run as nobody, so a missing command failed as "Permission denied", not "not found"."""
    from gridbot.worker.isolation import SAFE_PATH, RunAs, searchable_path

    nobody = RunAs("nobody", 65534, 65534, (), "/nonexistent")
    import shutil
    import tempfile

    # not under pytest's base folder, which only root may search
    tmp_path = Path(tempfile.mkdtemp(prefix="gridbot-path-"))
    private, shared, group = tmp_path / "private", tmp_path / "shared" / "bin", tmp_path / "group"
    for d in (private, shared, group):
        d.mkdir(parents=True)
    tmp_path.chmod(0o755)
    private.chmod(0o700)
    shared.parent.chmod(0o711)
    os.chown(group, 0, 65534)
    group.chmod(0o750)
    path = f"{private}:{shared}:{group}:relative/bin:{tmp_path}/gone:/usr/bin"
    assert searchable_path(path, nobody) == f"{shared}:{group}:/usr/bin"
    assert searchable_path(str(private), nobody) == SAFE_PATH
    env = job_environment((), "tok", nobody, {"PATH": path, "HOME": "/root"})
    assert env["PATH"] == f"{shared}:{group}:/usr/bin" and env["HOME"] == "/nonexistent"
    assert job_environment((), "tok", None, {"PATH": path})["PATH"] == path, "the worker's own user: as it is"
    shutil.rmtree(tmp_path)


def test_the_watchdog_outlives_signals_and_kills_marked_processes_at_end_of_file():
    """Ctrl-C or SIGTERM to the worker's group must not take the watchdog first; the end of its pipe does."""
    token = new_token()
    marked = subprocess.Popen(["sleep", "1000.301"], env={"PATH": os.environ["PATH"], "GRIDBOT_RUN": token},
                              start_new_session=True)
    other = subprocess.Popen(["sleep", "1000.302"], env={"PATH": os.environ["PATH"], "GRIDBOT_RUN": "another"},
                             start_new_session=True)
    watchdog, pipe = start_watchdog(token)
    try:
        ignoring = sum(1 << (sig - 1) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
        wait_for(lambda: _ignored(watchdog.pid) & ignoring == ignoring, 10, "the watchdog never set its signals")
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            watchdog.send_signal(sig)
        time.sleep(0.2)
        assert watchdog.poll() is None and marked.poll() is None
        os.close(pipe)
        assert watchdog.wait(10) == 0
        assert marked.wait(5) == -signal.SIGKILL
        assert other.poll() is None, "another worker's job"
    finally:
        other.kill()
        marked.kill()
        other.wait()


def _ignored(pid: int) -> int:
    """The mask of signals `pid` ignores (bit n-1 for signal n)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    return 0


def test_the_input_cache_takes_back_a_chmod_and_drops_a_change(tmp_path):
    cache = InputCache(tmp_path)
    path = cache.store((1, "a.txt"), b"content")
    assert path.name == hashlib.sha256(b"content").hexdigest() and path.stat().st_mode & 0o777 == 0o444
    assert cache.intact((1, "a.txt"))
    path.chmod(0o644)
    assert cache.intact((1, "a.txt")) and path.stat().st_mode & 0o777 == 0o444, "same content: kept, read-only again"
    path.chmod(0o644)
    path.write_bytes(b"CONTENT")
    assert not cache.intact((1, "a.txt")) and not path.exists(), "changed: dropped, to be downloaded again"
    assert not cache.intact((2, "never-stored"))


def test_a_job_over_its_memory_limit_fails_saying_so(cluster, tmp_path):
    cluster.start_server()
    cluster.start_worker("--slots", "1")
    grow = f"{sys.executable} -c 'import time; b = bytes(range(256)) * (300 << 12); time.sleep(60)'"  # 300 MB
    submit(cluster, tmp_path, "m", f'command = "{grow}"\nmemory = "100M"\nmax_failures = 1\n')
    started = time.monotonic()
    assert cluster.wait_bag("m", timeout=30).state == "failed"
    reason = only_job(cluster, "m")["reason"]
    assert re.search(r"used [1-9]\d\d MB, over the bag's memory limit of 100 MB$", reason), reason
    assert time.monotonic() - started < 20


def test_rlimits_reach_the_job(cluster, tmp_path):
    """cpu_time, max_file_size and max_processes are set on the job's first process just after it starts;
    what it runs then inherits them (the sleep lets the worker set them: see isolation.apply_limits)."""
    cluster.start_server()
    submit(cluster, tmp_path, "r", 'command = "sleep 0.3; cat /proc/self/limits > limits.txt"\n'
                                   'outputs = ["limits.txt"]\ncpu_time = "90s"\nmax_file_size = "1M"\n'
                                   "max_processes = 4000\n")
    submit(cluster, tmp_path, "f", 'command = "sleep 0.3; head -c 2000000 /dev/zero > big"\nmax_file_size = "1M"\n'
                                   "max_failures = 1\n")
    cluster.start_worker("--slots", "2")
    assert cluster.wait_bag("r").state == "completed"
    with cluster.client() as c:
        [result] = list(c.results("r"))
    limits = {line[:26].strip(): line[26:].split()[:2] for line in result.outputs["limits.txt"].decode().splitlines()}
    assert limits["Max cpu time"] == ["90", "95"]
    assert limits["Max file size"] == [str(1 << 20)] * 2
    assert limits["Max processes"] == ["4000", "4000"]
    assert cluster.wait_bag("f").state == "failed"
    assert "the bag's max_file_size limit of 1,048,576 bytes" in only_job(cluster, "f")["reason"]


def test_a_job_cannot_change_another_bags_cached_input(cluster, tmp_path):
    """Bag b's input is cached by the worker when its first job runs; a job of bag a then rewrites the
    cached file (as root it may); b's second job still gets what b submitted."""
    (tmp_path / "data.txt").write_text("original\n")
    cached = tmp_path / "w0" / ".inputs" / "sha256" / hashlib.sha256(b"original\n").hexdigest()
    flag = tmp_path / "flag"
    cluster.start_server()
    cluster.start_worker("--slots", "1")
    submit(cluster, tmp_path, "b", f'command = "cat data.txt > seen.txt; if [ {{i}} = 1 ]; then while [ ! -e {flag} ]; '
                                   f'do sleep 0.05; done; fi"\ninputs = ["data.txt"]\noutputs = ["seen.txt"]\n'
                                   "[parameters]\ni = [1, 2]\n")
    with cluster.client() as c:
        wait_for(lambda: c.bag("b").counts.running == 1, 20, "b's first job never started")
        # running is counted when the job is sent; the worker stores the input (atomically) before it starts it
        # (a busy machine once took longer than this test's first look: FileNotFoundError)
        wait_for(cached.exists, 20, "b's input was never cached")
        assert cached.read_text() == "original\n" and cached.stat().st_mode & 0o777 == 0o444
        submit(cluster, tmp_path, "a", f'command = "chmod 644 {cached} && printf evil > {cached}"\n'
                                       'max_failures = 1\n[policy]\nRank = "10"\n')
        time.sleep(1.0)  # a's job reaches the dispatcher's window: it outranks b's second one
        flag.touch()
        assert cluster.wait_bag("a").state == "completed", "the job did overwrite the cache"
        assert cluster.wait_bag("b").state == "completed"
        seen = {r.job.index: r.outputs["seen.txt"] for r in c.results("b")}
    assert seen == {0: b"original\n", 1: b"original\n"}
    assert "changed in the cache; downloading it again" in cluster.workers[0].log
    assert cached.read_text() == "original\n" and cached.stat().st_mode & 0o777 == 0o444


def test_inputs_named_with_what_a_url_must_escape_reach_the_job(cluster, tmp_path):
    """Found by the API review of 2026-11-27: the worker put an input's name into the download's URL as it was,
    so a name with `?`, `#` or `%` was cut or misread and every job of the bag failed to stage it (404)."""
    names = ["a?b.txt", "c#d.txt", "e%41.txt", "sp ace.txt"]
    for n, name in enumerate(names):
        (tmp_path / name).write_text(f"{n}\n")
    cluster.start_server()
    cluster.start_worker("--slots", "1")
    listed = ", ".join(f'"{name}"' for name in names)
    submit(cluster, tmp_path, "odd", f'command = "cat a?b.txt c#d.txt e%41.txt \'sp ace.txt\' > seen.txt"\n'
                                     f'inputs = [{listed}]\noutputs = ["seen.txt"]\nmax_failures = 1\n')
    assert cluster.wait_bag("odd").state == "completed", only_job(cluster, "odd")["reason"]
    with cluster.client() as c:
        assert [r.outputs["seen.txt"] for r in c.results("odd")] == [b"0\n1\n2\n3\n"]


def test_a_root_worker_needs_run_as_or_allow_root(tmp_path):
    with pytest.raises(UsageError, match=r"give --run-as USER .* or --allow-root"):
        resolve_user(None, False, euid=0)
    assert resolve_user(None, True, euid=0) is None
    with pytest.raises(UsageError, match="--run-as root runs jobs as root: add --allow-root"):
        resolve_user("root", False, euid=0)
    with pytest.raises(UsageError, match="needs the worker to start as root"):
        resolve_user("root", True, euid=12345)
    with pytest.raises(UsageError, match="no such user"):
        resolve_user("no-such-user-gridbot", False, euid=0)
    assert resolve_user(None, False, euid=12345) is None, "not root: jobs run as the worker's user"
    if ROOT:
        proc = gridbot("worker", "--server", "http://127.0.0.1:9", "--workdir", str(tmp_path / "w"),
                       "--idle-timeout", "1", timeout=60)
        assert proc.returncode == 2 and "--run-as USER" in proc.stderr and "--allow-root" in proc.stderr, proc.stderr


def _nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


@pytest.mark.skipif(not ROOT or _nobody() is None, reason="needs root and the user nobody")
def test_jobs_run_as_the_run_as_user_and_cannot_point_the_worker_elsewhere(cluster, tmp_path):
    nobody = _nobody()
    assert nobody is not None
    (tmp_path / "in.txt").write_text("input\n")
    cluster.start_server()
    submit(cluster, tmp_path, "u", 'command = "id -u > id.txt; id -g >> id.txt; [ -O in.txt ] && echo mine >> id.txt"\n'
                                   'inputs = ["in.txt"]\noutputs = ["id.txt"]\n')
    sneaky = ('command = "rm -f .gridbot-stdout && ln -s /etc/shadow .gridbot-stdout && ln -s /etc/shadow o"\n'
              'outputs = ["o"]\nmax_failures = 1\n')
    submit(cluster, tmp_path, "s", sneaky)
    cluster.start_worker("--slots", "1", "--run-as", "nobody")
    assert cluster.wait_bag("u").state == "completed"
    with cluster.client() as c:
        [result] = list(c.results("u"))
    assert result.outputs["id.txt"].decode().split() == [str(nobody.pw_uid), str(nobody.pw_gid), "mine"]
    assert cluster.wait_bag("s").state == "failed"
    job = only_job(cluster, "s")
    assert "expected output 'o' was not produced" in job["reason"]
    with cluster.client() as c:
        [result] = list(c.results("s"))
    assert "root:" not in result.stdout_tail, "the worker read a file through the job's link"
