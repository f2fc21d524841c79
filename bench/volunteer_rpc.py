"""Scheduler RPCs a second: simulated BOINC clients against a real `gridbot server` with a volunteer pool.

Each simulated client speaks the stock client's protocol over HTTP: a scheduler request asking for work, an
upload of each result's file (the wrapper's format, an empty successful run) through the upload handler
with the token its reply gave, and the report of those results (with `other_results`) in its next request.
Jobs take no time, so this measures the server: XML in and out, authentication, the dispatcher and the
store's group commit (SQLite, synchronous=FULL). BOINC's own server answered about 100 jobs a second in the
paper's era. Not a test:
    .venv/bin/python bench/volunteer_rpc.py [--jobs 5000] [--clients 50] [--ncpus 4]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

RESULT = b"gridbot-result 1\nstatus 0\nend\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


async def client(n: int, url: str, key: str, ncpus: int, stats: dict[str, int], stop: asyncio.Event) -> None:
    hostid, reports = 0, []
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            async with http.post(url + "scheduler", data=request(key, hostid, f"sim{n}", ncpus, True, reports,
                                                                 [])) as r:
                text = await r.text()
            stats["rpcs"] += 1
            stats["reported"] += len(reports)
            reports = []
            if m := re.search(r"<hostid>(\d+)</hostid>", text):
                hostid = int(m.group(1))
            uploads = re.findall(r"<name>(gb\d+_[0-9a-f]+_out)</name>\s*<upload_url>[^<]*</upload_url>\s*"
                                 r"<max_nbytes>(\d+)</max_nbytes>\s*<xml_signature>\s*([0-9a-f]+)\s*</xml_signature>",
                                 text)
            for name, limit, token in uploads:
                header = (f"<data_server_request>\n<file_upload>\n<file_info>\n<name>{name}</name>\n<xml_signature>\n"
                          f"{token}\n</xml_signature>\n<max_nbytes>{limit}</max_nbytes>\n</file_info>\n"
                          f"<nbytes>{len(RESULT)}</nbytes>\n<md5_cksum>{hashlib.md5(RESULT).hexdigest()}</md5_cksum>\n"
                          "<offset>0</offset>\n<data>\n")
                async with http.post(url + "file_upload_handler", data=header.encode() + RESULT) as r:
                    assert "<status>0</status>" in await r.text()
                stats["uploads"] += 1
                reports.append(name[:-len("_out")])
            if not uploads:
                delay = re.search(r"<request_delay>(\d+)</request_delay>", text)
                await asyncio.sleep(min(1.0, float(delay.group(1)) if delay else 1.0))


async def run(url: str, keys: list[str], ncpus: int, jobs: int) -> tuple[float, dict[str, int]]:
    stats = {"rpcs": 0, "uploads": 0, "reported": 0}
    stop = asyncio.Event()
    start = time.perf_counter()
    tasks = [asyncio.create_task(client(n, url, k, ncpus, stats, stop)) for n, k in enumerate(keys)]
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
            elapsed, stats = asyncio.run(run(f"http://127.0.0.1:{vport}/", accounts, args.ncpus, args.jobs))
        finally:
            server.terminate()
            server.wait(30)
    print(f"machine: {platform.node()} {platform.machine()} ({os.cpu_count()} CPUs), Python "
          f"{platform.python_version()}; server and clients on the same machine")
    print(f"{args.jobs:,} jobs, {args.clients} simulated BOINC clients of {args.ncpus} CPUs, SQLite synchronous=FULL")
    print(f"{elapsed:.1f} s: {stats['rpcs'] / elapsed:,.0f} scheduler RPCs/s, {stats['uploads'] / elapsed:,.0f} "
          f"uploads/s, {stats['reported'] / elapsed:,.0f} jobs/s reported")


if __name__ == "__main__":
    main()
