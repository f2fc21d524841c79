"""Bad input to the commands a reviewer tried: each is refused with a message naming the problem and exit
status 2, never a traceback, and a refusal changes nothing (no key registered, no bag cancelled).

Real `gridbot` processes, as a user types them; a real server where the command needs one.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gridbot.security.keys import load_registry
from tests.integration.harness import gridbot

SCENARIO = """
[simulation]
seed = 5

[pools.cluster]
kind = "cluster"
size = 20

[bags.sweep]
jobs = 50
runtime = { dist = "uniform", low = "1m", high = "3m" }
"""

NOT_UTF8 = b"\xff\xfe[pools.local]\n"


def _umask() -> int:
    """This process's umask (the gridbot it runs inherits it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def refused(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """The command was refused as bad input: exit status 2, each of `words` in its message, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    message = " ".join(proc.stderr.split())  # the console wraps long lines
    for w in words:
        assert w in message, (w, proc.stderr)


def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return path


def submit_queued(cluster, tmp_path: Path, name: str = "q") -> None:
    """An active bag that stays active: no worker takes its jobs."""
    spec = tmp_path / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = "echo {{i}}"\n[parameters]\ni = [1, 2, 3]\n')
    with cluster.client() as c:
        c.submit_file(spec)


# -- 1: nan and infinity -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "option"), [
    (("simulate", "{scenario}", "--scale", "nan"), "--scale"),
    (("plan", "--scenario", "{scenario}", "--budget", "nan"), "--budget"),
    (("plan", "--scenario", "{scenario}", "--budget", "inf"), "--budget"),
    # --pools of a missing file: were the option taken, the server would stop there instead of serving
    (("server", "--heartbeat", "nan", "--pools", "missing.toml"), "--heartbeat"),
    (("server", "--host-timeout", "nan", "--pools", "missing.toml"), "--host-timeout"),  # cli/options.py's
    (("worker", "--idle-timeout", "inf", "--access", "missing.json"), "--idle-timeout"),
    (("worker", "--min-cpu", "nan", "--access", "missing.json"), "--min-cpu"),
    (("submit", "--each-line", "missing.txt", "--budget", "nan"), "--budget"),
])
def test_nan_and_infinity_are_refused_by_float_options(tmp_path, args, option):
    path = scenario(tmp_path)
    proc = gridbot(*(a.format(scenario=path) for a in args), cwd=tmp_path, timeout=60)
    refused(proc, f"Invalid value for '{option}'", "is not a finite number", "give one in the range")


# -- 2: gridbot report --out -------------------------------------------------------------------------------


def test_report_refuses_an_out_it_cannot_write_naming_it(cluster, tmp_path):
    cluster.start_server()
    submit_queued(cluster, tmp_path)
    (tmp_path / "afile").write_text("")
    refused(gridbot("report", "q", "--out", "/proc/x.html"),
            "cannot write the report /proc/x.html", "/proc does not exist or takes no files", "give --out a file")
    refused(gridbot("report", "q", "--out", "afile/x.html", cwd=tmp_path),
            "cannot write the report afile/x.html", "afile is not a folder")
    refused(gridbot("report", "q", "--out", ""), "names no file", "such as report.html")
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"
    done = gridbot("report", "q", "--out", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr


# -- 3: gridbot plan --plot --------------------------------------------------------------------------------


def test_plan_refuses_a_plot_it_cannot_write_naming_it(tmp_path):
    path = scenario(tmp_path)  # with a grid: ExPERT plans a tail sent to unreliable pools
    path.write_text(SCENARIO.replace("[bags.sweep]", '[pools.grid]\nkind = "grid"\nsize = 10\n\n[bags.sweep]'))
    (tmp_path / "afile").write_text("")
    refused(gridbot("plan", "--scenario", str(path), "--plot", "/proc/x.png"),
            "cannot write the plot /proc/x.png", "/proc does not exist or takes no files", "give --plot a file")
    refused(gridbot("plan", "--scenario", str(path), "--plot", "afile/x.png", cwd=tmp_path),
            "cannot write the plot afile/x.png", "afile is not a folder")
    refused(gridbot("plan", "--scenario", str(path), "--plot", "x.txt", cwd=tmp_path),
            "cannot write a .txt image", ".png")
    refused(gridbot("plan", "--scenario", str(path), "--plot", "", cwd=tmp_path), "names no file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "s.toml"], "nothing written"
    # the plot was saved through whatever was at the name: a link's target overwritten, a pipe waited on
    # forever; now refused before the planning, and a plot is renamed into place whole
    (tmp_path / "link.png").symlink_to(tmp_path / "afile")
    os.mkfifo(tmp_path / "pipe.png")
    refused(gridbot("plan", "--scenario", str(path), "--plot", "link.png", cwd=tmp_path),
            "--plot link.png is a symbolic link, not a regular file", "give --plot another name")
    refused(gridbot("plan", "--scenario", str(path), "--plot", "pipe.png", cwd=tmp_path),
            "--plot pipe.png is a named pipe")
    assert (tmp_path / "afile").read_text() == "" and (tmp_path / "pipe.png").is_fifo()
    done = gridbot("plan", "--scenario", str(path), "--plot", "f.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "f.png").stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


# -- 4 and 5: gridbot access -------------------------------------------------------------------------------


def test_export_worker_refuses_an_out_it_cannot_write(cluster, tmp_path):
    cluster.start_server()
    (tmp_path / "afile").write_text("")
    for out, why in (("afile/w.json", "afile is not a folder"), ("/proc/w.json", "/proc does not exist")):
        proc = gridbot("access", "export-worker", "local", "--out", out, "--access-file", str(cluster.access),
                       cwd=tmp_path)
        refused(proc, f"cannot write the access file {out}", why, "give --out a file in a folder you may write")


def test_add_submitter_with_a_bad_out_registers_nothing(cluster, tmp_path):
    cluster.start_server()
    (tmp_path / "afile").write_text("")
    registry = tmp_path / "gridbot-keys.json"
    before = registry.read_bytes()
    for out, why in (("afile/b.json", "afile is not a folder"), ("/proc/b.json", "/proc does not exist")):
        proc = gridbot("access", "add-submitter", "bob", "--out", out, "--access-file", str(cluster.access),
                       cwd=tmp_path)
        refused(proc, f"cannot write the access file {out}", why, "give --out a file in a folder you may write")
        assert registry.read_bytes() == before, "the registry is as it was"
        assert not load_registry(registry).live("submitter", "bob")
    bob = tmp_path / "bob.json"
    again = gridbot("access", "add-submitter", "bob", "--out", str(bob), "--access-file", str(cluster.access))
    assert again.returncode == 0, again.stderr
    assert load_registry(registry).live("submitter", "bob") and json.loads(bob.read_text())["submitter"]


# -- 6: files that are not UTF-8 ---------------------------------------------------------------------------


def test_files_that_are_not_text_are_refused_by_plan_and_server(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(NOT_UTF8)
    refused(gridbot("plan", "--scenario", str(bad)), f"{bad} is not a text file", "a scenario is TOML")
    refused(gridbot("server", "--pools", str(bad), "--db", "memory://", "--no-auth", cwd=tmp_path, timeout=60),
            f"{bad} is not a text file", "a pools file is TOML")
    refused(gridbot("simulate", str(bad)), f"{bad} is not a text file")  # as simulate did already


# -- 7: gridbot delete --keep-results ----------------------------------------------------------------------


def test_delete_checks_where_the_results_go_before_it_cancels(cluster, tmp_path):
    cluster.start_server()
    submit_queued(cluster, tmp_path)
    (tmp_path / "afile").write_text("")
    other = tmp_path / "other"
    other.mkdir()
    (other / ".gridbot-results.json").write_text(json.dumps({"bag": "x", "bag_id": 99, "created_at": 1.0}))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    for folder, words in ((tmp_path / "afile" / "sub", ("cannot write the results to",)),
                          (Path("/proc/kept"), ("cannot write the results to /proc/kept",)),
                          (other, ("holds the results of another bag", "--force")),
                          (busy, ("is not empty", "--force"))):
        refused(gridbot("delete", "q", "--keep-results", str(folder)), str(folder), *words)
        with cluster.client() as c:
            assert c.bag("q").state == "active", f"{folder}: the bag is not cancelled"
    assert (busy / "notes.txt").read_text() == "mine" and not (other / "jobs.jsonl").exists()
    kept = tmp_path / "kept"
    done = gridbot("delete", "q", "--keep-results", str(kept))
    assert done.returncode == 0, done.stderr
    assert "deleted bag" in done.stdout and (kept / "jobs.jsonl").exists()


# -- 8: server URLs urllib cannot take apart ---------------------------------------------------------------


def test_a_server_url_with_a_bad_port_or_ipv6_host_is_refused_as_garbage_is(tmp_path):
    access = tmp_path / "a.json"
    access.write_text(json.dumps({"server": "http://[::1"}))
    access.chmod(0o600)
    for args, env, url, why in (
            (("status",), {"GRIDBOT_SERVER": "http://[::1"}, "http://[::1", "Invalid IPv6 URL"),
            (("status", "--server", "http://127.0.0.1:99999"), {}, "http://127.0.0.1:99999", "Port out of range"),
            (("status", "--server", "http://127.0.0.1:abc"), {}, "http://127.0.0.1:abc", "'abc'"),
            (("status", "--server", "http://127.0.0.1:0"), {}, "http://127.0.0.1:0", "port 0 is no port"),  # was 80
            (("status", "--access", str(access)), {}, "http://[::1", "Invalid IPv6 URL"),
            (("worker", "--slots", "1", "--allow-root", "--access", str(access), "--server", "http://127.0.0.1:99999"),
             {}, "http://127.0.0.1:99999", "Port out of range"),
            (("status", "--server", "garbage"), {}, "garbage", "")):
        refused(gridbot(*args, cwd=tmp_path, timeout=60, env=env), f"server URL {url!r} is not http://host:port", why)


# -- 9: keys with a newline or a control character ---------------------------------------------------------


def test_a_key_loses_the_whitespace_around_it_and_is_refused_with_a_control_character_inside(cluster, tmp_path):
    cluster.start_server()
    grants = json.loads(cluster.access.read_text())
    slipped = tmp_path / "nl.json"  # `echo KEY > file` leaves a newline after the key
    slipped.write_text(json.dumps({"server": cluster.url, "submitter": grants["submitter"] + "\n"}))
    slipped.chmod(0o600)
    listed = gridbot("status", "--access", str(slipped))
    assert listed.returncode == 0 and "no bags" in listed.stdout, listed.stderr
    pilot = gridbot("worker", "--slots", "1", "--allow-root", "--idle-timeout", "1", "--workdir", str(tmp_path / "w"),
                    "--server", cluster.url, "--access", str(slipped), cwd=tmp_path, timeout=60,
                    env={"GRIDBOT_WORKER_KEY": f" {grants['workers']['local']}\n"})
    assert pilot.returncode == 0 and "Traceback" not in pilot.stderr, pilot.stderr
    broken = tmp_path / "ctl.json"
    broken.write_text(json.dumps({"server": cluster.url, "submitter": "gb.ab\x01cd"}))
    broken.chmod(0o600)
    refused(gridbot("status", "--access", str(broken)), f"the access file {broken}: its submitter key has '\\x01'",
            "copy the key again")
    refused(gridbot("worker", "--slots", "1", "--allow-root", "--server", "http://127.0.0.1:1", "--give-up-after", "1",
                    "--access", str(slipped), cwd=tmp_path, timeout=60, env={"GRIDBOT_WORKER_KEY": "bad\nkey"}),
            "the environment variable GRIDBOT_WORKER_KEY has '\\n' at character 4", "copy the key again")
    refused(gridbot("status", "--server", cluster.url, env={"GRIDBOT_ACCESS": "", "GRIDBOT_KEY": "bad\tkey"}),
            "the environment variable GRIDBOT_KEY has '\\t'")
    unused = gridbot("status", "--access", str(slipped), env={"GRIDBOT_KEY": "bad\tkey"})  # the file's key is used
    assert unused.returncode == 0 and "no bags" in unused.stdout, unused.stderr


# -- 10: COLUMNS -------------------------------------------------------------------------------------------


def test_a_columns_that_is_no_width_is_ignored_and_a_tiny_one_still_shows_the_table(cluster, tmp_path):
    cluster.start_server()
    submit_queued(cluster, tmp_path)
    for columns, width in (("abc", 250), ("-5", 250), ("0", 250), ("", 250), ("3", 50), ("80", 80)):
        listed = gridbot("status", env={"COLUMNS": columns})
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, (columns, listed.stderr)
        header, row = listed.stdout.splitlines()
        assert header.split()[0] == "ID" and row.split()[:2] == ["1", "q"], (columns, listed.stdout)
        assert width < 250 or "active" in row, (columns, row)
        assert 50 <= max(len(header), len(row)) <= width, (columns, listed.stdout)
    refused(gridbot("status", "--server", "garbage", env={"COLUMNS": "-5"}), "server URL 'garbage' is not")


# -- 11: files that start with a byte order mark, or are not UTF-8 -----------------------------------------


def test_a_byte_order_mark_at_the_start_of_an_each_line_file_or_a_spec_is_not_read_as_text(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "cmds.txt").write_bytes(bom + b"true\r\necho second\r\n")  # as Notepad saves it
    (tmp_path / "sweep.toml").write_bytes(bom + b'command = "echo {x}"\n[parameters]\nx = [1, 2]\n')
    for args, bag, jobs in ((("--each-line", "cmds.txt"), "cmds", 2), (("sweep.toml",), "sweep", 2)):
        proc = gridbot("run", *args, "--workers", "1", cwd=tmp_path)
        assert proc.returncode == 0 and f"bag {bag}: completed" in proc.stdout, proc.stdout + proc.stderr
        rows = [json.loads(line) for line in (tmp_path / f"results/{bag}/jobs.jsonl").read_text().splitlines()]
        assert [r["state"] for r in rows] == ["done"] * jobs, rows
    assert (tmp_path / "results/cmds/1/stdout").read_text() == "second\n"


def test_an_each_line_file_or_spec_that_is_not_utf8_names_its_line_and_the_fix(tmp_path):
    (tmp_path / "cmds.txt").write_bytes(b"true\r\necho caf\xe9\n")
    (tmp_path / "s.toml").write_bytes(NOT_UTF8)
    refused(gridbot("submit", "--each-line", "cmds.txt", cwd=tmp_path),
            "each-line file cmds.txt is not UTF-8 text (byte 0xe9 on line 2): save it as UTF-8")
    refused(gridbot("run", "s.toml", cwd=tmp_path), "spec s.toml is not UTF-8 text (byte 0xff on line 1)",
            "save it as UTF-8")
