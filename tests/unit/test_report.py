"""Issue 20: `gridbot report` writes one self-contained HTML file: inline CSS and SVG, nothing to fetch."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser

import pytest

from gridbot.cli import report
from gridbot.cli.report import ReportData, render
from gridbot.core.changes import BagCounts
from gridbot.core.strategy import TailPlan
from gridbot.errors import GridbotError
from gridbot.protocol import BagInfo, JobInfo
from gridbot.server.aggregates import RUNTIME_EDGES, runtime_bin
from gridbot.server.console import BagSeries, BagSummary, HostPage, HostRow


class _Tags(HTMLParser):
    """Every start tag with its attributes, to look for anything that would be fetched."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _data(description: str = "a sweep") -> ReportData:
    t0 = 1_800_000_000.0
    counts = BagCounts(done=90, failed=2, instances=100, wasted=8, replicas=6)
    plan = TailPlan("N=2 T=1Tur", "min cost", t0 + 50, t0 + 50, 1, 10, 30.0, 0.02, 3.0, 0.001, "",
                    [("N=1", 60.0, 0.01), ("N=2 T=1Tur", 30.0, 0.02)], done=4, elapsed=20.0)
    info = BagInfo(1, "sweep<1>", "active", 100, counts, t0, None, "abc", description, ["pool x cannot start pilots"],
                   tail_plan=plan)
    times = [t0 + k * 10 for k in range(11)]
    runtime = [0] * (len(RUNTIME_EDGES) + 1)
    runtime[runtime_bin(4.0)] = 90
    series = BagSeries(BagSummary(info, 1.5, 5.3, 0.08), t0 + 100, times, [100 - 9 * k for k in range(11)],
                       {"local": [9] * 10, "slurm": [0] * 10}, {"local": [36.0] * 10, "slurm": [0.0] * 10}, 10.0,
                       list(RUNTIME_EDGES), runtime)
    host = HostRow("h1", "node1", "local", 4, 90, 2, 0.02, False, 90, 4.2, t0 + 99, True)
    hosts = HostPage(2, 2, 0, 20, [host], 0, 2)
    failed = [JobInfo(10, 9, "failed", "run <9>", 3, 3, "exit code 1")]
    return ReportData(series, failed, None, hosts, {"Rank": "-Host.ErrorRate"}, "http://127.0.0.1:8470", t0 + 100)


def test_the_report_is_one_file_that_fetches_nothing():
    text = render(_data())
    parser = _Tags()
    parser.feed(text)
    names = [tag for tag, _ in parser.tags]
    assert "script" not in names and "link" not in names and "img" not in names and "iframe" not in names
    for tag, attrs in parser.tags:
        for key in ("src", "href", "srcset", "data", "poster"):
            assert not attrs.get(key), f"<{tag} {key}=...> would be fetched"
    assert not re.search(r"url\(|@import", text), "the inline CSS fetches nothing either"
    assert names.count("svg") == 3 and "style" in names
    # the only URL is the server's, as text
    assert re.findall(r"https?://[^\s<'\";]+", text) == ["http://127.0.0.1:8470"]


def test_the_report_shows_the_bag_and_escapes_what_users_wrote():
    text = render(_data(description="<script>alert(1)</script>"))
    assert "<script>alert" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "sweep&lt;1&gt;" in text and "run &lt;9&gt;" in text
    assert "pool x cannot start pilots" in text  # diagnostics
    assert "N=2 T=1Tur" in text and "→ N=2 T=1Tur" in text  # the strategy in force, marked on its frontier
    assert "-Host.ErrorRate" in text and "node1" in text
    assert "<dd>90</dd>" in text and "<dd>8.0%</dd>" in text  # done, waste
    # the incomplete-jobs curve has a point per bucket and one for now; the histogram a bar per bin shown
    first = re.search(r"<path d='([^']+)'", text)
    assert first is not None and first.group(1).count("L") == 11
    assert text.count("<rect") >= 3


def test_the_report_is_never_written_over_a_link_a_pipe_or_a_folder(tmp_path, monkeypatch):
    """Audit: `--out PATH` renamed the report over whatever was at PATH (a symbolic link became a file, its
    target untouched; a FIFO was replaced) under a fixed temporary name two reports could share. Now only a
    regular file or a missing path is written, under a temporary name of its own."""
    monkeypatch.setattr(report, "fetch", lambda client, bag: _data())
    target = tmp_path / "target.html"
    target.write_text("kept")
    (tmp_path / "link.html").symlink_to(target)
    os.mkfifo(tmp_path / "pipe.html")
    (tmp_path / "folder.html").mkdir()
    for name, kind in (("link.html", "a symbolic link"), ("pipe.html", "a named pipe"), ("folder.html", "a folder")):
        with pytest.raises(GridbotError, match=f"--out .*{name} is {kind}, not a regular file.*give --out another"):
            report.write_report(None, "sweep", tmp_path / name)
    assert (tmp_path / "link.html").is_symlink() and target.read_text() == "kept"
    assert (tmp_path / "pipe.html").is_fifo() and (tmp_path / "folder.html").is_dir()
    assert report.write_report(None, "sweep", target) == target
    assert "sweep&lt;1&gt;" in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.html", "link.html", "pipe.html", "target.html"]


def test_concurrent_reports_never_share_a_temporary_file(tmp_path, monkeypatch):
    """The temporary file was `.NAME.tmp` for every report to NAME: a second report writing it at the same time
    mixed or lost the first's. Each write now has its own (mkstemp) and leaves none behind on failure."""
    names: list[str] = []
    real = os.replace

    def replace(src: str, dst: str) -> None:
        names.append(os.path.basename(src))
        real(src, dst)

    monkeypatch.setattr(report, "fetch", lambda client, bag: _data())
    monkeypatch.setattr(os, "replace", replace)
    for _ in range(2):
        report.write_report(None, "sweep", tmp_path / "r.html")
    assert len(set(names)) == 2 and all(n.startswith(".r.html.") for n in names)

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(GridbotError, match=r"cannot write the report .*r\.html: the disk is full"):
        report.write_report(None, "sweep", tmp_path / "r.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_plan_refuses_a_plot_name_taken_by_a_link_when_the_name_is_read_and_suggests_another_name(tmp_path):
    """(review) `gridbot plan --plot` asks `plot_format` before the planning, which takes seconds: a link at
    the name must be refused there, not only when the plot is written; and the example given is not the
    very name refused."""
    from gridbot.cli.plan import plot_format

    (tmp_path / "frontier.png").symlink_to(tmp_path / "elsewhere.png")
    with pytest.raises(GridbotError, match=r"--plot .*frontier.png is a symbolic link, not a regular file, and the "
                                           r"plot is written over nothing else; give --plot another name, such as "
                                           r"new-frontier.png$"):
        plot_format(tmp_path / "frontier.png")
    assert plot_format(tmp_path / "f.svg") == "svg"
