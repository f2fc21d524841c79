"""Issue 20: the web console in a real browser, against a real `gridbot server` and worker running real bags.

Debian's headless Chromium (`make test` installs it: scripts/chromium.sh) is driven by Playwright, pointed at
/usr/bin/chromium (Playwright's own browser download is never used). The pages' numbers are checked against
the JSON API, the incomplete-jobs plot is watched as jobs finish, a policy is changed and a bag cancelled
from the page, and a submitter's page never shows another owner's bag. Screenshots of each page go to
docs/console/, so the docs show the console as it is.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gridbot.security.access import read_access
from tests.integration.harness import GRIDBOT, Proc, free_port, gridbot

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
WAIT = 30_000
"""Milliseconds a page may take to show what the test waits for (it polls every 2 s)."""


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run the suite with `make test` (scripts/chromium.sh installs Debian's "
                    "chromium and chromium-driver)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def api(url: str, path: str, key: str | None, body: bytes | None = None) -> tuple[int, object]:
    """GET (or POST `body` as JSON) with a key; (status, decoded JSON)."""
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, data=body, method="POST" if body is not None else "GET", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw.startswith(b"{") else raw.decode(errors="replace")


def login(page, url: str, key: str) -> None:
    page.goto(f"{url}/ui")
    page.wait_for_selector("#login:not([hidden])")
    page.fill("#key-input", key)
    page.click("#login-btn")
    page.wait_for_selector("#login", state="hidden")


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def text(page, selector: str) -> str:
    """The text of the first element `selector` finds now ("" if none: never waits)."""
    found = page.locator(selector).all_text_contents()
    return found[0] if found else ""


def until(page, predicate, timeout: float = WAIT / 1000) -> None:
    """Wait until `predicate()` holds as the page polls (evaluated here: the console's CSP forbids eval)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the page never showed what was awaited"
        page.wait_for_timeout(200)


def spec(tmp: Path, name: str, text: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f'name = "{name}"\n{text}')
    return path


def test_the_console_watches_and_steers_a_live_bag(cluster, browser, tmp_path):
    cluster.start_server()
    keys = read_access(cluster.access)
    url = cluster.url
    bob = tmp_path / "bob.json"
    assert gridbot("access", "add-submitter", "bob", "--out", str(bob), "--access-file", str(cluster.access)
                   ).returncode == 0
    with cluster.client() as alice:
        alice.submit_file(spec(tmp_path, "sweep", 'description = "forty jobs, one fails"\nmax_failures = 1\n'
                               'command = "sleep 0.5; echo job {i}; echo out{i} > o.txt; test {i} -ne 3"\n'
                               'outputs = ["o.txt"]\n'
                               "[parameters]\ni = { from = 0, to = 39 }\n"))
    assert gridbot("submit", str(spec(tmp_path, "bob-bag", 'command = "true"\n[parameters]\ni = [1]\n')),
                   "--access", str(bob)).returncode == 0

    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: d.accept())
    login(page, url, keys.submitter)
    page.wait_for_selector('#bags tr[data-bag="sweep"]')
    assert page.locator('#bags tr[data-bag="bob-bag"]').count() == 0, "a submitter sees only its own bags"
    page.goto(f"{url}/ui#/bag/sweep")
    page.wait_for_selector("#plot-incomplete path.series", state="attached")
    assert page.get_attribute("#plot-incomplete", "data-live") == "40"

    # the incomplete-jobs plot moves as the worker finishes jobs, without a reload
    cluster.start_worker("--slots", "2")
    seen, paths = set(), set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        seen.add(int(page.get_attribute("#plot-incomplete", "data-live")))
        paths.add(page.get_attribute("#plot-incomplete path.series", "d"))
        if 0 in seen:
            break
        page.wait_for_timeout(500)
    assert 0 in seen and 40 in seen and len(seen) >= 4, f"the plot did not follow the bag: {sorted(seen)}"
    assert len(paths) >= 3
    info = cluster.wait_bag("sweep")
    until(page, lambda: text(page, "#bag-head .state") == "failed")
    shown = {f: page.text_content(f'#bag-counts dd[data-field="{f}"]')
             for f in ("total", "done", "failed", "instances")}
    c = info.counts
    assert shown == {"total": "40", "done": f"{c.done}", "failed": f"{c.failed}", "instances": f"{c.instances}"}
    assert (c.done, c.failed) == (39, 1)
    assert page.get_attribute("#plot-runtime", "data-total") == str(c.done), "every result is in the histogram"
    status, series = api(url, "/v1/console/bags/sweep", keys.submitter)
    assert status == 200 and series["incomplete"][0] == 40 and series["incomplete"][-1] == 0
    assert sum(sum(v) for v in series["done"].values()) == 39

    # a job's story and logs
    page.click('#jobs tr[data-job="3"]')
    page.wait_for_selector("#job-detail h3")
    assert page.text_content("#job-detail h3").startswith("Job 3: failed")
    assert "exit 1" in page.text_content("#job-detail")
    page.click('#jobs tr[data-job="5"]')
    until(page, lambda: text(page, "#job-detail h3").startswith("Job 5: done"))
    assert "job 5" in page.text_content("#job-detail pre.stdout")
    until(page, lambda: text(page, "#job-outputs a") == "o.txt")  # its output file, to download
    assert page.get_attribute("#job-outputs a", "href") == "data:application/octet-stream;base64,b3V0NQo="
    shot(page, "bag")

    # a policy: the API's own message for a bad one, and a good one taken
    page.select_option("#policy-name", "Rank")
    page.fill("#policy-text", "-Host.ErorRate")
    page.click("#policy-set")
    page.wait_for_selector("#policy-message.error")
    status, answer = api(url, "/v1/bags/sweep/policy", keys.submitter,
                         json.dumps({"name": "Rank", "text": "-Host.ErorRate"}).encode())
    assert status == 400 and page.text_content("#policy-message") == answer["error"]
    assert "ErrorRate" in answer["error"]
    page.fill("#policy-text", "-Host.ErrorRate")
    page.click("#policy-set")
    page.wait_for_selector("#policy-message.ok")
    assert api(url, "/v1/bags/sweep/policy", keys.submitter)[1]["Rank"] == "-Host.ErrorRate"

    # the bags page: its numbers are the API's; retry the failed job; cancel a bag
    with cluster.client() as alice:
        alice.submit_file(spec(tmp_path, "long", 'command = "sleep 60"\n[parameters]\ni = { from = 1, to = 6 }\n'))
    page.goto(f"{url}/ui#/bags")
    page.wait_for_selector('#bags tr[data-bag="long"]')
    row = page.locator('#bags tr[data-bag="sweep"]')
    assert (row.locator("td.c-done").text_content(), row.locator("td.c-failed").text_content(),
            row.locator("td.c-total").text_content()) == ("39", "1", "40")
    shot(page, "bags")
    row.locator("button.retry").click()
    page.wait_for_selector("#message.ok")
    assert page.text_content("#message") == "1 failed job(s) of sweep queued again"
    page.locator('#bags tr[data-bag="long"] button.cancel').click()
    until(page, lambda: text(page, '#bags tr[data-bag="long"] td.state') == "cancelled")
    assert api(url, "/v1/bags/long", keys.submitter)[1]["state"] == "cancelled"

    # another owner's bag is no bag, on the page and in the console's routes
    page.goto(f"{url}/ui#/bag/bob-bag")
    page.wait_for_selector("#status.error")
    assert "no bag 'bob-bag'" in page.text_content("#status")
    assert api(url, "/v1/console/bags/bob-bag", keys.submitter)[0] == 404
    bob_key = read_access(bob).submitter
    assert [b["info"]["name"] for b in api(url, "/v1/console/bags", bob_key)[1]] == ["bob-bag"]
    assert {b["info"]["name"] for b in api(url, "/v1/console/bags", keys.admin)[1]} == {"sweep", "bob-bag", "long"}

    # hosts: sorted, searched and paged on the server; the numbers are the API's
    hosts = api(url, "/v1/hosts", keys.submitter)[1]
    page.goto(f"{url}/ui#/hosts")
    page.wait_for_selector("#hosts tbody tr[data-host]")
    assert page.text_content("#host-count").startswith(f"{len(hosts)} of {len(hosts)} hosts")
    h = hosts[0]
    assert page.text_content(f'#hosts tr[data-host="{h["host_id"]}"] td.c-done') == f'{h["done"]:,}'
    page.click('#hosts th[data-sort="done"]')
    page.wait_for_selector('#hosts th[data-sort="done"].desc')
    shot(page, "hosts")
    page.fill("#host-search", "no-such-host")
    until(page, lambda: text(page, "#host-count").startswith("0 of"))

    # pools: the pool of the worker, with its live host and its effective throughput
    page.goto(f"{url}/ui#/pools")
    page.wait_for_selector('#pools tr[data-pool="local"]')
    assert page.text_content('#pools tr[data-pool="local"] td.hosts') == "1"
    page.wait_for_selector("#plot-throughput path.series", state="attached")

    # a phone: the bag page fits its width (tables scroll inside their boxes)
    phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    login(phone, url, keys.submitter)
    phone.goto(f"{url}/ui#/bag/sweep")
    phone.wait_for_selector("#plot-incomplete path.series", state="attached")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    phone.screenshot(path=str(SHOTS / "bag-phone.png"))
    phone.close()
    assert not errors, errors

    # `gridbot report`: one file, opened with nothing fetched but itself
    out = tmp_path / "report.html"
    proc = gridbot("report", "sweep", "--out", str(out), "--server", url)
    assert proc.returncode == 0, proc.stderr
    requests: list[str] = []
    report = browser.new_page(viewport={"width": 1280, "height": 800})
    report.on("request", lambda r: requests.append(r.url))
    report.goto(out.as_uri())
    assert report.locator("svg path").count() >= 2
    assert requests == [out.as_uri()], requests
    report.screenshot(path=str(SHOTS / "report.png"), full_page=True)
    report.close()
    page.close()


POOLS = """\
[pools.campus]
kind = "local"
max_running = 2
idle_timeout = 3
min_cpu = 0
allow_root = true

[pools.cloud]
kind = "local"
max_running = 1
idle_timeout = 3
min_cpu = 0
allow_root = true
"""


def test_the_pools_page_shows_the_overlays_pilots_and_each_pools_throughput(browser, tmp_path):
    from tests.integration.harness import Cluster

    (tmp_path / "pools.toml").write_text(POOLS)
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml"), "--state-dir",
                                             str(tmp_path / "state")))
    try:
        cluster.start_server()
        keys = read_access(cluster.access)
        with cluster.client() as c:
            c.submit_file(spec(tmp_path, "spread", 'command = "sleep 0.4"\n[parameters]\ni = { from = 1, to = 30 }\n'))
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        login(page, cluster.url, keys.admin)
        page.goto(f"{cluster.url}/ui#/pools")
        page.wait_for_selector('#pools tr[data-pool="campus"]')
        cluster.wait_bag("spread")
        # the table is the API's (/v1/pools), once the counts have settled (the bag is done: no new pilots)
        pools = {p["name"]: p for p in api(cluster.url, "/v1/pools", keys.admin)[1]}
        for name in ("campus", "cloud"):
            until(page, lambda n=name: text(page, f'#pools tr[data-pool="{n}"] td:nth-child(7)')
                  == f'{pools[n]["pilots_submitted"]:,}')
            assert pools[name]["pilots_submitted"] >= 1
        # the console serves a cached count once more while it counts again (at most a second old here):
        # the page's last poll may have counted before the bag's last results
        series: dict = {}

        def all_counted() -> bool:
            series.update(api(cluster.url, "/v1/console/pools", keys.admin)[1])
            return sum(sum(v) for v in series["results"].values()) == 30

        until(page, all_counted)
        assert set(series["pilots"]) == {"campus", "cloud"} and set(series["throughput"]) <= {"campus", "cloud"}
        until(page, lambda: page.locator("#plot-pilots path.series").count() == 4)  # queued and running of each
        assert page.locator("#plot-throughput path.series").count() == len(series["throughput"])
        shot(page, "pools")
        page.goto(f"{cluster.url}/ui#/bag/spread")
        page.wait_for_selector("#plot-pools path.series", state="attached")
        assert page.locator("#plot-pools path.series").count() == len(series["results"])
        page.close()
    finally:
        cluster.stop()


def test_the_shell_is_public_and_holds_no_data_and_the_rest_needs_a_key(cluster, tmp_path):
    cluster.start_server()
    keys = read_access(cluster.access)
    with cluster.client() as c:
        c.submit_file(spec(tmp_path, "secret-bag", 'command = "true"\n'))
    for path in ("/ui", "/ui/static/console.js", "/ui/static/console.css", "/ui/static/plot.js"):
        status, body = _raw(cluster.url + path)
        assert status == 200 and b"secret-bag" not in body, path
    # only the shell's own files: a path that escapes, or names anything else, is no file (and no route at all
    # answers without a key: 401 before the router's 404)
    for path in ("/ui/static/..%2F..%2Fserver.db", "/ui/static/", "/ui/static/%2e%2e", "/ui/x",
                 "/ui/static/__init__.py", "/ui/static/..%2Fserver%2Fapp.py"):
        assert _raw(cluster.url + path)[0] in (401, 404), path
    for path in ("/v1/console/bags", "/v1/console/bags/secret-bag", "/v1/console/hosts", "/v1/console/pools"):
        assert api(cluster.url, path, None)[0] == 401
        assert api(cluster.url, path, keys.workers["local"])[0] == 403
        assert api(cluster.url, path, keys.submitter)[0] == 200
    assert api(cluster.url, "/v1/console/hosts?sort=secret", keys.submitter)[0] == 400
    headers = urllib.request.urlopen(cluster.url + "/ui", timeout=10).headers
    assert "script-src 'self'" in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"


def test_gridbot_run_console_prints_a_url_that_opens_without_a_login(browser, tmp_path):
    bag = spec(tmp_path, "quick", 'command = "sleep 2"\n[parameters]\ni = { from = 1, to = 4 }\n')
    proc = subprocess.Popen([*GRIDBOT, "run", str(bag), "--console", "--workers", "2", "--db",
                             f"sqlite:///{tmp_path}/run.db", "--results", str(tmp_path / "res")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"console: (http://127\.0\.0\.1:\d+/ui#key=\S+)", line)
        assert found, line
        page = browser.new_page()
        page.goto(found.group(1))
        page.wait_for_selector('#bags tr[data-bag="quick"]', timeout=WAIT)
        assert page.is_hidden("#login") and "key=" not in page.url, "the key left the address bar"
        page.close()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_server_without_keys_asks_for_none(browser, tmp_path):
    port = free_port()
    server = Proc(["server", "--db", f"sqlite:///{tmp_path}/s.db", "--port", str(port), "--no-auth"],
                  tmp_path / "server.log", tmp_path).start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while _raw(url + "/ui")[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        page = browser.new_page()
        page.goto(f"{url}/ui")
        page.wait_for_selector("#bags td.empty", timeout=WAIT)
        assert page.is_hidden("#login")
        page.close()
    finally:
        server.stop()


def _raw(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


if __name__ == "__main__":  # pragma: no cover - run alone: python -m pytest tests/integration/test_console.py
    sys.exit(pytest.main([__file__, "-q"]))
