"""The quorums' validators at work: a reported result of a quorum job whose bag names a validator (`compare`)
is compared, by the admin's command, with one result of each group of the job's results that agree so far,
before the dispatcher counts it; the first group it is equivalent to gives its vote (the core then counts it
with them), none gives it a vote of its own (issue 19, docs/volunteers.md).

A job's results are compared one report at a time: the exchange that brings one holds the job's lock until
its changes are durable, so the next result of that job is compared with it too (two results compared at
once would each miss the other). The commands run on the executor's threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from gridbot.model.records import Outcome, Verdict, result_digest
from gridbot.model.spec import output_name_problem
from gridbot.model.validators import ValidatorSpec
from gridbot.protocol import ExchangeRequest
from gridbot.server.service import Service

log = logging.getLogger("gridbot.validate")

NOTE_ENTRIES = 4
"""Comparisons a result's story names one by one (a broken validator makes each result a group of its own)."""
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "HOME", "TMPDIR", "TZ")
"""The server's environment a validator gets (the rest may hold the pools' credentials)."""


class Validation:
    """The server's validators, and the per-job locks that make each job's comparisons see one another."""

    def __init__(self, service: Service, validators: Sequence[ValidatorSpec]) -> None:
        self.service = service
        self.validators = {v.name: v for v in validators}
        self._locks: dict[int, tuple[asyncio.Lock, list[int]]] = {}
        """Each job's lock and how many exchanges hold it or wait for it (the lock goes with the last)."""
        self.compared = 0
        """Comparisons run (a metric, and what the tests count)."""
        self.failed = 0
        """Comparisons the validator could not make (another exit status, a signal, its timeout)."""

    def pending(self, req: ExchangeRequest) -> dict[int, tuple[int, ValidatorSpec]]:
        """The exchange's reported results that a validator must compare: instance -> (job, validator)."""
        if not self.validators:
            return {}
        view = self.service.dispatcher.view
        out: dict[int, tuple[int, ValidatorSpec]] = {}
        for r in req.reports:
            if r.outcome is not Outcome.SUCCESS:
                continue
            inst = view.instance(r.instance_id)
            if inst is None or inst.host_id != req.host.host_id:
                continue
            job = view.job(inst.job_id)
            bag = view.bag(job.bag_id) if job is not None else None
            if job is None or bag is None or bag.spec.quorum < 2 or not bag.spec.compare:
                continue
            validator = self.validators.get(bag.spec.compare)
            if validator is None:  # removed from the pools file since the bag was submitted
                log.warning("bag %s names validator %r, which this server no longer has: its results are compared "
                            "byte for byte", bag.name, bag.spec.compare)
                continue
            out[r.instance_id] = (job.job_id, validator)
        return out

    @contextlib.asynccontextmanager
    async def holding(self, job_ids: Iterable[int]) -> AsyncIterator[None]:
        """Hold the jobs' locks (in order: two exchanges never wait on each other) for the block."""
        users: list[int] = []
        held: list[asyncio.Lock] = []
        try:
            for job_id in sorted(set(job_ids)):
                lock, count = self._locks.setdefault(job_id, (asyncio.Lock(), [0]))
                count[0] += 1
                users.append(job_id)
                await lock.acquire()
                held.append(lock)
            yield
        finally:
            for lock in held:
                lock.release()
            for job_id in users:
                _, count = self._locks[job_id]
                count[0] -= 1
                if not count[0]:
                    del self._locks[job_id]

    async def verdicts(self, req: ExchangeRequest,
                       pending: dict[int, tuple[int, ValidatorSpec]]) -> dict[int, Verdict]:
        """For each pending result compared, the vote of the first group of its job's results it is equivalent to
        (None: none), and what each comparison said, for its story."""
        out: dict[int, Verdict] = {}
        loop = asyncio.get_running_loop()
        view = self.service.dispatcher.view
        for r in req.reports:
            if r.instance_id not in pending:
                continue
            job_id, validator = pending[r.instance_id]
            job, bag = view.job(job_id), None
            if job is not None:
                bag = view.bag(job.bag_id)
            if job is None or bag is None or not job.votes:
                continue
            declared = set(bag.spec.outputs)
            if any(name not in declared or output_name_problem(name) for name in r.outputs):
                continue  # the dispatcher refuses such a result
            groups: dict[bytes, int] = {}
            for iid, vote in job.votes:
                groups.setdefault(vote, iid)
            if result_digest(r) in groups:
                continue  # byte for byte the same as a group: the dispatcher counts it there
            said: list[str] = []
            found: bytes | None = None
            for vote, iid in groups.items():
                other = self._stored(job_id, iid)
                if other is None:
                    continue
                self.compared += 1
                same, problem = await loop.run_in_executor(None, compare, validator, (r.stdout_tail, r.outputs),
                                                           other)
                if same is None:
                    self.failed += 1
                    said.append(f"could not compare it with instance {iid}'s ({problem}: counted as different)")
                elif same:
                    said.append(f"equivalent to instance {iid}'s")
                    found = vote
                    break
                else:
                    said.append(f"different from instance {iid}'s")
            if said:
                out[r.instance_id] = Verdict(found, note(validator.name, said))
        return out

    def _stored(self, job_id: int, instance_id: int) -> tuple[str, dict[str, bytes]] | None:
        """A result the job's quorum holds, as the store keeps it: its stdout and outputs."""
        row = next((i for i in self.service.store.instances_of(job_id) if i.instance_id == instance_id), None)
        if row is None:
            return None
        return row.stdout_tail or "", self.service.store.outputs_of(instance_id)


def note(validator: str, said: list[str]) -> str:
    """The story's line for one result's comparisons, in order: at most NOTE_ENTRIES, the first ones and the
    last (which decided), with how many more there were between them."""
    if len(said) > NOTE_ENTRIES:
        said = [*said[:NOTE_ENTRIES - 2], f"{len(said) - NOTE_ENTRIES + 1} more compared", said[-1]]
    return f"validator {validator}: {'; '.join(said)}"


class Compared(NamedTuple):
    """A validator's answer on two results."""

    same: bool | None
    """True equivalent, False not, None the validator failed."""
    problem: str = ""
    """How it failed, for the result's story, which the bag's submitter reads: the exit status or the timeout,
    not what the validator printed (the admin's program may print its own paths or settings; that goes to the
    server's log only)."""


def compare(validator: ValidatorSpec, a: tuple[str, dict[str, bytes]], b: tuple[str, dict[str, bytes]]) -> Compared:
    """Run the validator on two results."""
    with tempfile.TemporaryDirectory(prefix="gridbot-validate-") as tmp:
        dirs = []
        for name, (stdout, outputs) in (("a", a), ("b", b)):
            d = Path(tmp, name)
            d.mkdir()
            (d / "stdout").write_bytes(stdout.encode("utf-8", "surrogatepass"))
            for out_name, data in outputs.items():
                path = d / out_name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            dirs.append(str(d))
        env = {k: v for k in KEPT_ENV if (v := os.environ.get(k)) is not None}
        try:
            proc = subprocess.Popen([*validator.command, *dirs], cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            log.error("validator %s could not start: %s", validator.name, e)
            return Compared(None, "it could not start; the reason is in the server's log")
        try:
            _, err = proc.communicate(timeout=validator.timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            log.error("validator %s took over its timeout of %gs: the two results count as different",
                      validator.name, validator.timeout)
            return Compared(None, f"it took over its timeout of {validator.timeout:g}s")
        if proc.returncode in (0, 1):
            return Compared(proc.returncode == 0)
        tail = err[-400:].decode("utf-8", "replace").strip()
        log.error("validator %s exited with status %s (0: equivalent, 1: different): the two results count as "
                  "different%s", validator.name, proc.returncode, f"; it said: {tail}" if tail else "")
        return Compared(None, f"it exited with status {proc.returncode}; its message is in the server's log")

