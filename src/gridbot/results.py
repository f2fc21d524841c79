"""A bag's results on the user's disk: one folder per job and `jobs.jsonl`, never half-written, never mixed.

Every file is written under a temporary name beside it and renamed into place, so an interrupted or failed
download leaves each file as it was or as it should be, never cut; `jobs.jsonl` is written the same way
and renamed last, so an earlier index stays whole until the new one is complete. The folder is marked with
the bag whose results it holds (`.gridbot-results.json`: its name, id, creation time, spec hash and
revision). Writing into a folder that holds another bag's results, or files that are not results at all,
is refused unless forced: it used to merge silently. Forced over another bag's results, it removes them
first (what that bag's `jobs.jsonl` names), keeping files of the user's. A file-system error (a file
where a folder should be, no permission, a folder that takes no files such as /proc) is a GridbotError
naming the path, the cause and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from gridbot.errors import GridbotError
from gridbot.model.states import JobState
from gridbot.protocol import BagInfo, ResultInfo

MARKER = ".gridbot-results.json"
"""The file naming the bag whose results a folder holds."""
INDEX = "jobs.jsonl"
IDENTITY = ("bag", "bag_id", "created_at")
"""What tells one bag from another across stores and servers: a bag deleted and submitted again under the
same name, or the same name in another store, is another bag."""


class ResultsFolder:
    """The folder that takes one bag's results (`prepare`, then `write`)."""

    def __init__(self, directory: str | Path, info: BagInfo, force: bool = False) -> None:
        self.root = Path(directory)
        self.info = info
        self.force = force
        self.width = len(str(max(0, info.total - 1)))
        self.mark = {"bag": info.name, "bag_id": info.bag_id, "created_at": info.created_at,
                     "spec_hash": info.spec_hash, "revision": info.revision}

    def prepare(self) -> None:
        """Make the folder and mark it as the bag's, or refuse (GridbotError) a folder holding anything else
        (unless forced): a `gridbot run` checks this before the bag runs, not after."""
        with _os_errors(self.root):
            if self.root.exists() and not self.root.is_dir():
                raise GridbotError(f"{self.root} is a file, not a folder; give a folder for the results")
            self._check()
            if self.force:
                self._clear_another_bags()
            self.root.mkdir(parents=True, exist_ok=True)
            _write_atomic(self.root / MARKER, (json.dumps(self.mark, indent=1) + "\n").encode(), sync=True)

    def _check(self) -> None:
        """Refuse a folder that holds another bag's results or files that are not results (unless forced)."""
        if self.force or not self.root.is_dir():
            return
        theirs = _marker(self.root)
        if theirs is not None:
            if self._ours(theirs):
                return
            twin = isinstance(theirs, dict) and all(theirs.get(k) == self.mark[k] for k in ("bag", "bag_id"))
            other = "a bag of the same name and id from another store, or deleted and submitted again" if twin else \
                "another bag"
            raise GridbotError(f"{self.root} holds the results of {other} ({_describe(theirs)}), not of bag "
                               f"'{self.info.name}' (id {self.info.bag_id}, {_when(self.info.created_at)}); give "
                               "another folder, or --force to write these results over those")
        if any(self.root.iterdir()):
            what = "results of an unnamed bag (jobs.jsonl)" if (self.root / INDEX).exists() else "files"
            raise GridbotError(f"{self.root} is not empty (it holds {what}) and holds no results of bag "
                               f"'{self.info.name}'; give a new or empty folder, or --force to write into it")

    def _ours(self, mark: Any) -> bool:
        """Whether a folder's marker names this bag (`IDENTITY`), not another one or nothing readable."""
        return isinstance(mark, dict) and all(mark.get(k) == self.mark[k] for k in IDENTITY)

    def _clear_another_bags(self) -> None:
        """Before results are forced over another bag's, remove that bag's: each job folder its `jobs.jsonl`
        names with the stdout, stderr and outputs written there, then the index, so the folder never holds two
        bags' results (it used to keep every file the new results did not replace: bag b's 3 jobs over bag a's
        5 left a's folders 3 and 4). Only what gridbot wrote goes: a file of the user's, and the folder that
        holds it, stay. Without a readable index the job folders cannot be told from the user's, so a folder
        that has any is refused. The old marker stays until all is removed, so a failure half-way can be
        forced again."""
        theirs = _marker(self.root)
        if theirs is None or self._ours(theirs):
            return
        folders: dict[int, list[Path]] = {}
        for p in self.root.iterdir():
            if p.name.isascii() and p.name.isdigit() and p.is_dir() and not p.is_symlink():
                folders.setdefault(int(p.name), []).append(p)
        rows = _index_rows(self.root / INDEX)
        if rows is None and folders:
            raise GridbotError(f"{self.root} holds the results of another bag ({_describe(theirs)}) but no readable "
                               f"{INDEX} naming the files written for it, so --force cannot tell them from yours; "
                               "remove its job folders yourself, or give another folder")
        for index, outputs in rows or []:
            for jobdir in folders.get(index, []):
                _remove_written(jobdir, outputs)
        (self.root / INDEX).unlink(missing_ok=True)

    @staticmethod
    def refuse_for_a_new_bag(directory: str | Path, name: str, force: bool = False) -> None:
        """Refuse (GridbotError) a folder that could not take a bag not yet submitted, before it is: anything in
        it is another bag's or not results (unless forced). `gridbot run` asks this first, so a refused folder
        leaves no bag behind in the store."""
        root = Path(directory)
        with _os_errors(root):
            if root.exists() and not root.is_dir():
                raise GridbotError(f"{root} is a file, not a folder; give a folder for the results")
            if force or not root.is_dir() or not any(root.iterdir()):
                return
            theirs = _marker(root)
            if theirs is not None:
                same = isinstance(theirs, dict) and theirs.get("bag") == name
                other = "an earlier bag of that name, from another store or deleted since" if same else "another bag"
                raise GridbotError(f"{root} holds the results of {other} ({_describe(theirs)}), not of the new bag "
                                   f"'{name}'; give another folder, or --force to write these results over those")
            what = "results of an unnamed bag (jobs.jsonl)" if (root / INDEX).exists() else "files"
            raise GridbotError(f"{root} is not empty (it holds {what}) and holds no results of bag '{name}'; give a "
                               "new or empty folder, or --force to write into it")

    def write(self, results: Iterable[ResultInfo]) -> int:
        """Write each result's folder, then `jobs.jsonl` in one rename; return the number of jobs written."""
        n = 0
        index_path = self.root / INDEX
        tmp = _temp(index_path)
        with _os_errors(self.root), _removed_on_error(tmp), tmp.open("w") as index:
            for r in results:
                self._write_job(r)
                _index_line(index, r)
                n += 1
            index.flush()
            os.fsync(index.fileno())
            os.replace(tmp, index_path)
        return n

    def _write_job(self, r: ResultInfo) -> None:
        """One job's stdout, stderr and outputs in `<index>/`, each file replaced whole."""
        jobdir = self.root / str(r.job.index).zfill(self.width)
        jobdir.mkdir(exist_ok=True)
        inside = jobdir.resolve()
        if inside.parent != self.root.resolve():
            raise GridbotError(f"{jobdir} leads out of the results folder (a link?); remove it, or give another "
                               "folder")
        files = {"stdout": r.stdout_tail.encode(), "stderr": r.stderr_tail.encode(), **r.outputs}
        for name, data in files.items():
            target = jobdir / name
            if not target.resolve().is_relative_to(inside):
                raise GridbotError(f"output name {name!r} of job {r.job.index} escapes the results folder")
            if not data and name in ("stdout", "stderr"):
                target.unlink(missing_ok=True)  # an earlier run's, which this result replaces
                continue
            target.parent.mkdir(parents=True, exist_ok=True)  # outputs may be paths: "out/a.txt"
            _write_atomic(target, data)


def _marker(root: Path) -> Any:
    """The folder's marker as written (a dict, if gridbot wrote it), {} if it cannot be read, None if none."""
    marker = root / MARKER
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text())
    except (ValueError, UnicodeDecodeError):
        return {}


def _index_rows(path: Path) -> list[tuple[int, list[str]]] | None:
    """(job index, output names) of each line of a `jobs.jsonl`, or None if it is missing or not one."""
    try:
        lines = path.read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    out = []
    for row in rows:
        if not isinstance(row, dict):
            return None
        index, outputs = row.get("index"), row.get("outputs", [])
        if not (isinstance(index, int) and index >= 0 and isinstance(outputs, list)
                and all(isinstance(o, str) for o in outputs)):
            return None
        out.append((index, outputs))
    return out


def _remove_written(jobdir: Path, outputs: list[str]) -> None:
    """Remove from a job folder the files gridbot wrote there (stdout, stderr, the outputs named), then the
    folders that leaves empty; nothing outside the folder, and nothing else in it."""
    inside = jobdir.resolve()
    emptied = {jobdir}
    for name in ("stdout", "stderr", *outputs):
        target = jobdir / name
        if target.resolve().is_relative_to(inside) and target.is_file() and not target.is_symlink():
            target.unlink()
            emptied.update(p for p in target.parents if p.is_relative_to(jobdir))
    for folder in sorted(emptied, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty: it holds a file of the user's
            folder.rmdir()


def _index_line(index: IO[str], r: ResultInfo) -> None:
    index.write(json.dumps({
        "index": r.job.index, "state": r.job.state, "command": r.job.command, "params": r.params,
        "exit_code": r.exit_code, "wall_s": r.wall_s, "cpu_s": r.cpu_s, "host": r.host_id,
        "attempts": r.job.attempts, "reason": r.job.reason if r.job.state != JobState.DONE else None,
        "outputs": sorted(r.outputs), "revision": r.job.revision}) + "\n")


def _temp(path: Path) -> Path:
    """A temporary name beside `path`, hidden, that no other process picks."""
    return path.with_name(f".{path.name[:180]}.{os.getpid()}.tmp")


def _write_atomic(path: Path, data: bytes, sync: bool = False) -> None:
    """Replace `path` with `data` whole: written beside it, then renamed over it."""
    tmp = _temp(path)
    with _removed_on_error(tmp):
        with tmp.open("wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)


@contextlib.contextmanager
def _removed_on_error(tmp: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def _os_errors(root: Path) -> Iterator[None]:
    """Turn the file system's errors into a GridbotError that says what is wrong and what to do."""
    try:
        yield
    except OSError as e:
        where = e.filename or root
        if e.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            why = f"a file is in the way where a folder should be, or a folder where a file should ({e.strerror})"
        elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            why = f"no permission to write there ({e.strerror})"
        elif e.errno == errno.ENOSPC:
            why = "the disk is full"
        else:
            why = e.strerror or str(e)
        raise GridbotError(f"cannot write the results to {root}: {where}: {why}; give a folder you may write "
                           "(or move what is in the way)") from None


def _describe(mark: Any) -> str:
    if not isinstance(mark, dict) or "bag" not in mark:
        return "its marker cannot be read"
    return f"'{mark.get('bag')}', id {mark.get('bag_id')}, {_when(mark.get('created_at'))}"


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "submitted at an unknown time"
    return "submitted " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
