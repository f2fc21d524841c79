"""Scheduler RPCs a second: simulated BOINC clients against a real `gridbot server` with a volunteer pool.

Each simulated client speaks the stock client's protocol over HTTP: a scheduler request asking for work, an
upload of each result's file (the wrapper's format, an empty successful run) through the upload handler
with the token its reply gave, and the report of those results (with `other_results`) in its next request.
It does no more than that, over one kept-alive connection of plain asyncio streams (aiohttp's client cost
about twice the CPU), and the CPU it takes is printed beside the server's.
Jobs take no time, so this measures the server: XML in and out, authentication, the dispatcher and the
store's group commit (SQLite, synchronous=FULL). BOINC's own server answered about 100 jobs a second in the
paper's era. Not a test:
    .venv/bin/python bench/volunteer_rpc.py [--jobs 5000] [--clients 50] [--ncpus 4] [--downloads]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULT = b"gridbot-result 1\nstatus 0\nend\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process `pid` has used (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss(pid: int) -> int:
    """Process `pid`'s peak resident set, KiB (Linux)."""
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmHWM:"))


def request(key: str, hostid: int, cpid: str, ncpus: int, want: bool, reports: list[str], held: list[str]) -> bytes:
    results = "".join(f"<result><name>{n}</name><state>5</state><exit_status>0</exit_status>"
                      "<final_cpu_time>0.5</final_cpu_time><final_elapsed_time>0.5</final_elapsed_time>"
                      "<stderr_out></stderr_out></result>\n" for n in reports)
    others = "".join(f"<other_result><name>{n}</name></other_result>" for n in held)
    return (f"<scheduler_request>\n<authenticator>{key}</authenticator>\n<hostid>{hostid}</hostid>\n"
            f"<platform_name>x86_64-pc-linux-gnu</platform_name>\n<code_sign_key>1024\n.</code_sign_key>\n"
            f"<work_req_seconds>{1000 if want else 0}</work_req_seconds>\n"
            f"<cpu_req_instances>{ncpus if want else 0}</cpu_req_instances>\n"
            f"<host_info><host_cpid>{cpid}</host_cpid><domain_name>sim</domain_name><p_ncpus>{ncpus}</p_ncpus>"
            f"<p_fpops>1e9</p_fpops></host_info>\n{results}<other_results>{others}</other_results>\n"
            "</scheduler_request>\n").encode()


class Connection:
    """One kept-alive HTTP/1.1 connection, as little client as can be: the bench measures the server."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: bytes | None) -> bytes:
        """The body of the answer to a POST of `body` to `path` (None: a GET)."""
        if self.streams is None:
            self.streams = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.streams
        if body is None:
            writer.write(b"GET /%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path.encode())
        else:
            writer.write(b"POST /%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/xml\r\nContent-Length: %d\r\n"
                         b"\r\n%s" % (path.encode(), len(body), body))
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        m = re.search(rb"\r\ncontent-length: *(\d+)", head)
        assert head.startswith(b"http/1.1 200") and m is not None, head
        return await reader.readexactly(int(m.group(1)))

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()


UPLOAD_RE = re.compile(r"<name>(gb\d+_[0-9a-f]+_out)</name>\s*<upload_url>[^<]*</upload_url>\s*<max_nbytes>(\d+)"
                       r"</max_nbytes>\s*<xml_signature>\s*([0-9a-f]+)\s*</xml_signature>")
MD5 = hashlib.md5(RESULT).hexdigest()
JOB_RE = re.compile(r"<url>http://[^/<]+/(download/[0-9a-f]+/gb\d+_[0-9a-f]+_job)</url>")


async def client(n: int, port: int, key: str, ncpus: int, stats: dict[str, int], stop: asyncio.Event,
                 download: bool) -> None:
    hostid, reports = 0, []
    http = Connection(port)
    try:
        while not stop.is_set():
            text = (await http.post("scheduler", request(key, hostid, f"sim{n}", ncpus, True, reports, []))).decode()
            stats["rpcs"] += 1
            stats["reported"] += len(reports)
            reports = []
            if m := re.search(r"<hostid>(\d+)</hostid>", text):
                hostid = int(m.group(1))
            uploads = UPLOAD_RE.findall(text)
            for path in JOB_RE.findall(text) if download else []:
                assert await http.post(path, None)
                stats["downloads"] += 1
            for name, limit, token in uploads:
                header = (f"<data_server_request>\n<file_upload>\n<file_info>\n<name>{name}</name>\n<xml_signature>\n"
                          f"{token}\n</xml_signature>\n<max_nbytes>{limit}</max_nbytes>\n</file_info>\n"
                          f"<nbytes>{len(RESULT)}</nbytes>\n<md5_cksum>{MD5}</md5_cksum>\n<offset>0</offset>\n<data>\n")
                assert b"<status>0</status>" in await http.post("file_upload_handler", header.encode() + RESULT)
                stats["uploads"] += 1
                reports.append(name[:-len("_out")])
            if not uploads:
                delay = re.search(r"<request_delay>(\d+)</request_delay>", text)
                await asyncio.sleep(min(1.0, float(delay.group(1)) if delay else 1.0))
    finally:
        http.close()


async def run(port: int, keys: list[str], ncpus: int, jobs: int, download: bool) -> tuple[float, dict[str, int]]:
    stats = {"rpcs": 0, "uploads": 0, "reported": 0, "downloads": 0}
    stop = asyncio.Event()
    start = time.perf_counter()
    tasks = [asyncio.create_task(client(n, port, k, ncpus, stats, stop, download)) for n, k in enumerate(keys)]
    while stats["reported"] < jobs:
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - start
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return elapsed, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--ncpus", type=int, default=4)
    parser.add_argument("--downloads", action="store_true",
                        help="Also fetch each job's job file, as the stock client does (a GET a job more).")
    parser.add_argument("--profile", metavar="FILE", help="Run the server under cProfile, its stats to FILE.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, vport, port = Path(tmp), free_port(), free_port()
        (folder / "pools.toml").write_text(f'[pools.v]\nkind = "volunteer"\nport = {vport}\nruntime_estimate = 1\n')
        (folder / "bag.toml").write_text(f'name = "b"\ncommand = "true"\n[parameters]\ni = {{ from = 1, to = '
                                         f'{args.jobs} }}\n')
        gb = [sys.executable, "-m", "gridbot"]
        env = {**os.environ, "GRIDBOT_ACCESS": str(folder / "gridbot-access.json")}
        profiled = [sys.executable, "-m", "cProfile", "-o", str(Path(args.profile or "x").resolve()), "-m", "gridbot"]
        command = [*(profiled if args.profile else gb), "server", "--db", f"sqlite:///{folder}/g.db", "--port",
                   str(port), "--pools", str(folder / "pools.toml"), "--state-dir", str(folder / "state")]
        server = subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", vport)) == 0:
                        break
                time.sleep(0.1)
            keys = [subprocess.run([*gb, "volunteers", "add", f"v{n}"], cwd=folder, capture_output=True, text=True,
                                   check=True).stdout.strip() for n in range(min(args.clients, 5))]
            subprocess.run([*gb, "submit", "bag.toml", "--server", f"http://127.0.0.1:{port}"], cwd=folder, env=env,
                           check=True, capture_output=True)
            accounts = [keys[n % len(keys)] for n in range(args.clients)]
            before, mine = cpu_seconds(server.pid), resource.getrusage(resource.RUSAGE_SELF)
            elapsed, stats = asyncio.run(run(vport, accounts, args.ncpus, args.jobs, args.downloads))
            after, used = cpu_seconds(server.pid), resource.getrusage(resource.RUSAGE_SELF)
            peak = peak_rss(server.pid)
        finally:
            server.terminate()
            server.wait(30)
    print(f"machine: {platform.node()} {platform.machine()} ({os.cpu_count()} CPUs), Python "
          f"{platform.python_version()}; server and clients on the same machine")
    print(f"{args.jobs:,} jobs, {args.clients} simulated BOINC clients of {args.ncpus} CPUs, SQLite synchronous=FULL")
    print(f"{elapsed:.1f} s: {stats['rpcs'] / elapsed:,.0f} scheduler RPCs/s, {stats['uploads'] / elapsed:,.0f} "
          f"uploads/s, {stats['reported'] / elapsed:,.0f} jobs/s reported"
          + (f", {stats['downloads'] / elapsed:,.0f} job-file downloads/s" if args.downloads else ""))
    client = used.ru_utime + used.ru_stime - mine.ru_utime - mine.ru_stime
    print(f"CPU: server {after - before:.1f} s ({(after - before) / elapsed:.0%} of one CPU), the simulated clients "
          f"{client:.1f} s ({client / elapsed:.0%}); server peak RSS {peak / 1024:,.0f} MiB")


if __name__ == "__main__":
    main()
