"""`gridbot results --force` over another bag's results (gridbot.results): that bag's files go, nothing else.

Audit: forcing bag b's results into a folder of bag a's kept every file of a's that b's did not replace (a's
job folders past b's last, a's outputs that b's jobs do not make), though the refusal promised to write
"these results over those" and the module "never mixed"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gridbot.core.changes import BagCounts
from gridbot.errors import GridbotError
from gridbot.protocol import BagInfo, JobInfo, ResultInfo
from gridbot.results import ResultsFolder


def _bag(name: str, bag_id: int, total: int) -> BagInfo:
    return BagInfo(bag_id, name, "completed", total, BagCounts(done=total), 1_800_000_000.0 + bag_id, None, "h")


def _result(index: int, outputs: dict[str, bytes]) -> ResultInfo:
    return ResultInfo(JobInfo(index + 1, index, "done", f"run {index}", 0, 1, None), {}, 0, 1.0, 1.0, "h1",
                      f"out {index}\n", "", outputs)


def _write(root: Path, info: BagInfo, results: list[ResultInfo], force: bool = False) -> None:
    folder = ResultsFolder(root, info, force)
    folder.prepare()
    folder.write(results)


def test_forcing_another_bags_folder_removes_what_gridbot_wrote_for_it_and_keeps_the_users(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write(out, _bag("a", 1, 12), [_result(i, {"a.txt": b"a", "deep/x/y.dat": b"y"}) for i in range(12)])
    (out / "notes.txt").write_text("mine")
    (out / "07" / "deep" / "mine.txt").write_text("mine")
    (out / "99").mkdir()  # a folder of the user's that a's index does not name
    with pytest.raises(GridbotError, match="holds the results of another bag"):
        _write(out, _bag("b", 2, 3), [_result(i, {"b.txt": b"b"}) for i in range(3)])
    _write(out, _bag("b", 2, 3), [_result(i, {"b.txt": b"b"}) for i in range(3)], force=True)
    assert sorted(p.name for p in out.iterdir()) == [".gridbot-results.json", "0", "07", "1", "2", "99",
                                                     "jobs.jsonl", "notes.txt"]
    assert sorted(p.name for p in (out / "0").iterdir()) == ["b.txt", "stdout"]
    assert [str(p.relative_to(out)) for p in (out / "07").rglob("*")] == ["07/deep", "07/deep/mine.txt"]
    assert [json.loads(x)["outputs"] for x in (out / "jobs.jsonl").read_text().splitlines()] == [["b.txt"]] * 3


def test_forcing_never_follows_a_link_out_of_the_folder(tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    _write(out, _bag("a", 1, 2), [_result(i, {"o": b"a"}) for i in range(2)])
    elsewhere.mkdir()
    (elsewhere / "stdout").write_text("not gridbot's")
    (elsewhere / "o").write_text("not gridbot's")
    for p in (out / "1").iterdir():
        p.unlink()
    (out / "1").rmdir()
    (out / "1").symlink_to(elsewhere)  # a job folder that is a link
    (out / "0" / "o").unlink()
    (out / "0" / "o").symlink_to(elsewhere / "o")  # an output that is a link
    _write(out, _bag("b", 2, 1), [_result(0, {})], force=True)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["o", "stdout"]
    assert (out / "1").is_symlink() and (out / "0" / "o").is_symlink()


def test_forcing_a_folder_whose_index_is_gone_is_refused_rather_than_guessed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _write(out, _bag("a", 1, 2), [_result(i, {"o": b"a"}) for i in range(2)])
    (out / "jobs.jsonl").unlink()  # as a download cut short before its index leaves it
    with pytest.raises(GridbotError, match=r"no readable jobs\.jsonl .* remove its job folders yourself"):
        _write(out, _bag("b", 2, 1), [_result(0, {})], force=True)
    assert json.loads((out / ".gridbot-results.json").read_text())["bag"] == "a"
    assert sorted(p.name for p in (out / "1").iterdir()) == ["o", "stdout"]
