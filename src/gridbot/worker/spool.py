"""Results the server has not acknowledged, kept on disk while it cannot be reached.

A worker that loses the server keeps running what it holds; each result that ends meanwhile is written
here (one file per instance, written whole then renamed), and so is everything still unsent when the
worker stops. A worker started again on the same host (same slot, same host credential) finds them and
hands them in at its first exchange; a file is removed once the server has acknowledged its result.
While the server answers, nothing is written: the spool costs the common path nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import msgspec

from gridbot.model.records import InstanceReport

log = logging.getLogger("gridbot.worker")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(InstanceReport).decode


class ReportSpool:
    """The folder of one host's unacknowledged results."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.kept: set[int] = set()
        """Instances whose result is on disk now."""

    def keep(self, reports: Iterable[InstanceReport]) -> None:
        """Write each report not on disk yet; a failure to write is logged, never raised (the result is
        still in memory and goes to the server if it comes back before the worker stops)."""
        for r in reports:
            if r.instance_id in self.kept:
                continue
            path = self.directory / f"{r.instance_id}.msgpack"
            tmp = path.with_suffix(".part")
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                tmp.write_bytes(_encode(r))
                os.replace(tmp, path)
            except OSError as e:
                log.warning("cannot keep the result of instance %d on disk (%s)", r.instance_id, e)
                continue
            self.kept.add(r.instance_id)

    def acknowledged(self, ids: Iterable[int]) -> None:
        """The server has these results: their files go."""
        for iid in ids:
            if iid in self.kept:
                self.kept.discard(iid)
                with contextlib.suppress(OSError):
                    (self.directory / f"{iid}.msgpack").unlink()

    def load(self) -> list[InstanceReport]:
        """The results an earlier run of this host left unacknowledged, oldest instance first."""
        out = []
        with contextlib.suppress(OSError):
            for path in sorted(self.directory.glob("*.msgpack"), key=lambda p: int(p.stem)):
                try:
                    r = _decode(path.read_bytes())
                except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
                    log.warning("dropping an unreadable kept result %s (%s)", path, e)
                    with contextlib.suppress(OSError):
                        path.unlink()
                    continue
                out.append(r)
                self.kept.add(r.instance_id)
        if out:
            log.info("handing in %d results kept from an earlier run of this host", len(out))
        return out
