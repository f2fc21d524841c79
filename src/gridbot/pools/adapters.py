"""Pool adapters: local processes, batch systems through psij-python, EC2 through boto3, static hosts."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from gridbot.model.pools import KINDS, PoolMonitor, PoolSpec
from gridbot.model.states import PilotState
from gridbot.pools.base import PilotRequest, PoolAdapter, PoolError


class LocalAdapter(PoolAdapter):
    """Pilots as worker processes on this machine; ids are `local-<pid>`.

    The workers run in sessions of their own, so they outlive the server; a restarted server takes up
    those still alive by their pid (`attach`)."""

    poll_interval = 1.0

    def __init__(self, spec: PoolSpec, workdir: Path, extra_args: Sequence[str] = ()) -> None:
        super().__init__(spec)
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self.attached: dict[str, int] = {}
        """Workers started by an earlier run of the server: their pids."""
        self.cancelled: set[str] = set()

    @classmethod
    def for_pool(cls, spec: PoolSpec, workdir: Path) -> PoolAdapter:
        return cls(spec, workdir)

    def submit(self, n: int, pilot: PilotRequest) -> list[str]:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        ids = []
        for _ in range(n):
            path = logs / f"{self.spec.name}-{len(self.procs)}.log"
            with open(path, "ab") as log:
                proc = subprocess.Popen([pilot.python, *pilot.worker_args(self.spec), "--workdir",
                                         str(self.workdir / "work"), "--name", f"{self.spec.name}-pilot",
                                         *self.extra_args],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                        env={**_without_keys(os.environ), **pilot.env})
            self.procs[f"local-{proc.pid}"] = proc
            self.logs[f"local-{proc.pid}"] = path
            ids.append(f"local-{proc.pid}")
        return ids

    def why_failed(self, pilot: str) -> str:
        """The last line its worker wrote (its log), with its exit code."""
        proc, path = self.procs.get(pilot), self.logs.get(pilot)
        code = f"exit code {proc.returncode}" if proc is not None and proc.returncode is not None else ""
        lines: list[str] = []
        if path is not None:
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - 4096))
                    lines = [x.strip() for x in f.read().decode(errors="replace").splitlines() if x.strip()]
            except OSError:
                pass
        last = lines[-1][:300] if lines else ""
        return "; ".join(x for x in (code, last and f"its log ({path}) ends: {last}") if x)

    def status(self, ids: Sequence[str]) -> dict[str, PilotState]:
        out = {}
        for pilot in ids:
            proc = self.procs.get(pilot)
            if proc is None:  # a worker of an earlier run: its exit code went to that run
                alive = pilot in self.attached and _runs_worker(self.attached[pilot], self.spec.name)
                out[pilot] = PilotState.RUNNING if alive else PilotState.COMPLETED
                continue
            code = proc.poll()
            out[pilot] = (PilotState.RUNNING if code is None else
                          PilotState.COMPLETED if code in (0, -signal.SIGTERM) else PilotState.FAILED)
        return out

    def attach(self, pilots: Mapping[str, PilotState]) -> None:
        for pilot in pilots:
            pid = pilot.removeprefix("local-")
            if pid.isdigit() and _runs_worker(int(pid), self.spec.name):
                self.attached[pilot] = int(pid)

    def cancel(self, ids: Sequence[str]) -> None:
        for pilot in ids:
            proc = self.procs.get(pilot)
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
            elif pilot in self.attached and _runs_worker(self.attached[pilot], self.spec.name):
                os.kill(self.attached[pilot], signal.SIGTERM)
            self.cancelled.add(pilot)

    def alive(self) -> int:
        """How many of the workers still run."""
        return sum(1 for proc in self.procs.values() if proc.poll() is None)

    def close(self, timeout: float = 20.0) -> None:
        """Wait up to `timeout` for the workers cancelled to exit cleanly (they give their work back), then kill
        them; the others go on."""
        deadline = time.monotonic() + timeout
        for pilot in self.cancelled:
            proc, pid = self.procs.get(pilot), self.attached.get(pilot)
            if proc is not None:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            elif pid is not None:
                while _runs_worker(pid, self.spec.name) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if _runs_worker(pid, self.spec.name):
                    os.killpg(pid, signal.SIGKILL)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every worker, waiting up to `timeout` for clean exits (`gridbot run` at its end)."""
        self.cancel([*self.procs, *self.attached])
        self.close(timeout)


class StaticAdapter(PoolAdapter):
    """Hosts that come on their own (volunteers, hand-started workers): nothing to submit or cancel."""

    def submit(self, n: int, pilot: PilotRequest) -> list[str]:
        return []

    def status(self, ids: Sequence[str]) -> dict[str, PilotState]:
        return dict.fromkeys(ids, PilotState.COMPLETED)

    def cancel(self, ids: Sequence[str]) -> None:
        """Nothing to cancel: static hosts leave when they want."""


def _runs_worker(pid: int, pool: str) -> bool:
    """Whether process `pid` is a live `gridbot worker` of `pool` (the pid of one that ended may be another
    process's now). Without /proc, the pid's existence has to do."""
    proc = Path(f"/proc/{pid}")
    if not Path("/proc/self").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        args = (proc / "cmdline").read_bytes().split(b"\0")
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    at = args.index(b"--pool") + 1 if b"--pool" in args else len(args)
    return state != "Z" and b"worker" in args and args[at:at + 1] == [pool.encode()]


class BatchAdapter(PoolAdapter):
    """Pilots as batch jobs through psij-python: Slurm, PBS, LSF, Cobalt or Flux, one partition per pool.

    psij's defaults are changed as shared/reference/slurm-on-one-host.md says: it polls the queue every
    30 s by default, and after 2 failed polls marks every job FAILED for good (a 45 s controller outage
    did that while the jobs ran fine), so the threshold is set out of reach and polling made brisk.
    """

    poll_interval = 2.0

    def __init__(self, spec: PoolSpec, workdir: Path) -> None:
        super().__init__(spec)
        try:
            import psij
        except ImportError as e:
            raise PoolError(f"pool '{spec.name}' (kind {spec.kind}) needs psij-python: pip install 'gridbot[batch]'") \
                from e

        self.psij = psij
        self.workdir = Path(str(spec.options.get("work_dir") or workdir)) / spec.name
        self.workdir.mkdir(parents=True, exist_ok=True)
        # psij writes each pilot's job script, with the pool's worker key in it, in this folder: ours alone
        self.workdir.chmod(0o700)
        config = psij.JobExecutorConfig(launcher_log_file=None)
        try:
            executor_config = self._config(spec.kind)
            self.executor = psij.JobExecutor.get_instance(spec.kind, config=executor_config or config)
        except (ValueError, psij.SubmitException) as e:
            raise PoolError(f"pool '{spec.name}': psij has no usable '{spec.kind}' executor here: {e}") from e
        self.jobs: dict[str, Any] = {}
        self.recorded: dict[str, PilotState] = {}
        """The state recorded of each pilot taken up after a restart, until psij has polled it."""

    @classmethod
    def for_pool(cls, spec: PoolSpec, workdir: Path) -> PoolAdapter:
        return cls(spec, workdir)

    def _config(self, kind: str) -> Any:
        from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig

        return BatchSchedulerExecutorConfig(work_directory=self.workdir, queue_polling_interval=2,
                                            initial_queue_polling_delay=1, queue_polling_error_threshold=10**9)

    def submit(self, n: int, pilot: PilotRequest) -> list[str]:
        psij = self.psij
        ids = []
        for _ in range(n):
            attrs = psij.JobAttributes(queue_name=str(self.spec.options["partition"]),
                                       duration=timedelta(seconds=self.spec.walltime or 1))
            if not self.spec.walltime:  # no limit of ours: the queue's default, not PSI/J's 10 minutes
                attrs.duration = None  # (the constructor's type check takes no None; Slurm and PBS do)
            if "account" in self.spec.options:
                attrs.account = str(self.spec.options["account"])
            args = [*pilot.worker_args(self.spec), "--workdir", str(self.workdir / "work"), "--name",
                    f"{self.spec.name}-pilot"]
            spec = psij.JobSpec(executable=pilot.python, arguments=args, directory=self.workdir, attributes=attrs,
                resources=psij.ResourceSpecV1(process_count=1, cpu_cores_per_process=self.spec.cpus),
                stdout_path=self.workdir / "pilot.out", stderr_path=self.workdir / "pilot.err",
                inherit_environment=True, environment={**dict.fromkeys(USER_KEY_VARIABLES, ""), **pilot.env})
            job = psij.Job(spec)
            try:
                self.executor.submit(job)
            except psij.SubmitException as e:
                raise PoolError(f"pool '{self.spec.name}': the batch system refused the pilot: {e}") from e
            except OSError as e:
                raise PoolError(f"pool '{self.spec.name}': the {self.spec.kind} commands are not usable on this "
                                f"machine ({e}); is the batch system's client installed and on PATH?") from e
            self.jobs[job.native_id] = job
            ids.append(str(job.native_id))
        return ids

    def status(self, ids: Sequence[str]) -> dict[str, PilotState]:
        return {pilot: self._state(self.jobs.get(pilot), self.recorded.get(pilot, PilotState.QUEUED))
                for pilot in ids}

    def attach(self, pilots: Mapping[str, PilotState]) -> None:
        for pilot, state in pilots.items():
            job = self.psij.Job()
            self.executor.attach(job, pilot)  # psij polls the queue for it from now on
            self.jobs[pilot] = job
            self.recorded[pilot] = state

    def _state(self, job: Any, new: PilotState = PilotState.QUEUED) -> PilotState:
        """The pilot's state as psij last saw its job (`new` until psij has seen it)."""
        if job is None:
            return PilotState.COMPLETED
        s = self.psij.JobState
        state = job.status.state
        if state is s.NEW:
            return new
        if state is s.QUEUED:
            return PilotState.QUEUED
        if state is s.ACTIVE:
            return PilotState.RUNNING
        if state is s.CANCELED:
            return PilotState.CANCELLED
        if state is s.FAILED:
            message = str(job.status.message or "")
            return PilotState.COMPLETED if "TimeLimit" in message or "TIMEOUT" in message else PilotState.FAILED
        return PilotState.COMPLETED

    def why_failed(self, pilot: str) -> str:
        """The batch system's word on the pilot's job, and where its output went."""
        job = self.jobs.get(pilot)
        message = str(job.status.message or "").strip()[:300] if job is not None else ""
        return "; ".join(x for x in (message, f"its output: {self.workdir / 'pilot.err'}") if x)

    def cancel(self, ids: Sequence[str]) -> None:
        for pilot in ids:
            job = self.jobs.get(pilot)
            if job is not None and not job.status.final:
                with contextlib.suppress(Exception):
                    self.executor.cancel(job)

    def monitor(self, now: float) -> PoolMonitor | None:
        """Slurm's own view of the pool's partition, live: its CPUs (`scontrol show partition`: TotalCPUs, or
        MaxCPUsPerNode on each of its nodes where that is less), those its running jobs hold and those its
        pending jobs ask for (`squeue`, everyone's jobs, ours included), and the idle CPUs of its nodes (`sinfo`:
        other partitions share them). Other batch kinds have no monitor here yet."""
        if self.spec.kind != "slurm":
            return None
        partition = str(self.spec.options["partition"])
        text = _run(["scontrol", "show", "partition", partition, "--oneliner"], self.spec.name)
        fields = dict(f.split("=", 1) for f in text.split() if "=" in f)
        total = _int_field(fields, "TotalCPUs", self.spec.name)
        per_node = fields.get("MaxCPUsPerNode", "UNLIMITED")
        if per_node.isdigit():
            total = min(total, int(per_node) * _int_field(fields, "TotalNodes", self.spec.name))
        running = pending = pending_cpus = 0
        queue = _run(["squeue", "--noheader", "--partition", partition, "--states", "RUNNING,PENDING,CONFIGURING",
                      "--format", "%T %C"], self.spec.name)
        for line in queue.splitlines():
            state, _, cpus = line.strip().partition(" ")
            n = int(cpus) if cpus.strip().isdigit() else 0
            if state == "PENDING":
                pending, pending_cpus = pending + 1, pending_cpus + n
            else:
                running += n
        idle = total
        summary = _run(["sinfo", "--noheader", "--partition", partition, "--format", "%C"], self.spec.name).split()
        if summary and summary[0].count("/") == 3:  # allocated/idle/other/total of the partition's nodes
            idle = int(summary[0].split("/")[1])
        return PoolMonitor(max(0, min(total - running, idle)), total, pending, pending_cpus, now, 0.0,
                           f"scontrol/squeue/sinfo, partition {partition}")


class EC2Adapter(PoolAdapter):
    """Pilots as EC2 instances (on-demand or spot) whose user data starts a worker pointed at the server."""

    poll_interval = 10.0
    _STATES: ClassVar[dict[str, PilotState]] = {
        "pending": PilotState.QUEUED, "running": PilotState.RUNNING, "shutting-down": PilotState.COMPLETED,
        "terminated": PilotState.COMPLETED, "stopping": PilotState.COMPLETED, "stopped": PilotState.COMPLETED}
    """EC2 instance states (EC2 API reference, InstanceState): an instance that ends is a pilot that ended."""

    def __init__(self, spec: PoolSpec, client: Any = None) -> None:
        super().__init__(spec)
        if client is None:
            try:
                import boto3
            except ImportError as e:
                raise PoolError(f"pool '{spec.name}' (kind ec2) needs boto3: pip install 'gridbot[ec2]'") from e

            kwargs = {"region_name": str(spec.options["region"])}
            if "endpoint_url" in spec.options:
                kwargs["endpoint_url"] = str(spec.options["endpoint_url"])
            client = boto3.client("ec2", **kwargs)
        self.ec2 = client

    def user_data(self, pilot: PilotRequest) -> str:
        """The boot script: install gridbot (the pool's `install`, by default the server's own version: a pilot's
        command line has options an older worker does not know) and run one worker; the instance powers off when
        the script ends, however it ends (an install that fails must not leave an instance billed and silent)."""
        worker = PilotRequest(pilot.server, "python3").command(self.spec)
        exports = [f"export {k}={shlex.quote(v)}" for k, v in pilot.env.items()]
        package = shlex.quote(str(self.spec.options.get("install") or
                                  f"gridbot=={importlib.metadata.version('gridbot')}"))
        return "\n".join([
            "#!/bin/sh", "trap 'shutdown -h now' EXIT", "set -e", *exports,
            f"python3 -m pip install --quiet {package} || pip3 install --quiet {package}",
            f"{worker} --workdir /var/tmp/gridbot --name {self.spec.name}-pilot || true", ""])

    def submit(self, n: int, pilot: PilotRequest) -> list[str]:
        opts = self.spec.options
        request: dict[str, Any] = {
            "ImageId": str(opts["image"]), "InstanceType": str(opts["instance_type"]), "MinCount": n, "MaxCount": n,
            "UserData": self.user_data(pilot), "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [{"ResourceType": "instance",
                                   "Tags": [{"Key": "gridbot-pool", "Value": self.spec.name}]}]}
        if opts.get("spot"):
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
                "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        for key, field in (("subnet", "SubnetId"), ("key_name", "KeyName")):
            if key in opts:
                request[field] = str(opts[key])
        if "security_group" in opts:
            request["SecurityGroupIds"] = [str(opts["security_group"])]
        try:
            answer = self.ec2.run_instances(**request)
        except Exception as e:
            raise PoolError(f"pool '{self.spec.name}': EC2 refused to start {n} instances: {e}") from e
        return [i["InstanceId"] for i in answer["Instances"]]

    def status(self, ids: Sequence[str]) -> dict[str, PilotState]:
        if not ids:
            return {}
        out = dict.fromkeys(ids, PilotState.COMPLETED)
        try:
            pages = self.ec2.describe_instances(InstanceIds=list(ids))
        except Exception as e:
            raise PoolError(f"pool '{self.spec.name}': cannot list instances: {e}", ) from e
        for reservation in pages["Reservations"]:
            for inst in reservation["Instances"]:
                out[inst["InstanceId"]] = self._STATES.get(inst["State"]["Name"], PilotState.FAILED)
        return out

    def cancel(self, ids: Sequence[str]) -> None:
        if ids:
            try:
                self.ec2.terminate_instances(InstanceIds=list(ids))
            except Exception as e:
                raise PoolError(f"pool '{self.spec.name}': cannot terminate instances: {e}") from e


USER_KEY_VARIABLES = ("GRIDBOT_KEY", "GRIDBOT_ACCESS")
"""Variables of the server's own environment that may name a submitter's or admin's key: never a pilot's."""


def _run(argv: list[str], pool: str) -> str:
    """A Slurm command's output (PoolError, naming the pool and the command, if it fails)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PoolError(f"pool '{pool}': {argv[0]} failed: {e}") from e
    if done.returncode != 0:
        raise PoolError(f"pool '{pool}': {' '.join(argv[:3])} failed: {done.stderr.strip()[:300]}")
    return done.stdout


def _int_field(fields: Mapping[str, str], key: str, pool: str) -> int:
    value = fields.get(key, "")
    if not value.isdigit():
        raise PoolError(f"pool '{pool}': scontrol shows no {key} for its partition")
    return int(value)


def _without_keys(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in USER_KEY_VARIABLES}


def adapter_class(kind: str) -> type[PoolAdapter]:
    """The adapter class that the entry of `kind` in `KINDS` names."""
    module, _, name = KINDS[kind].adapter.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, PoolAdapter)):
        raise TypeError(f"KINDS[{kind!r}].adapter names {cls!r}, which is no PoolAdapter")
    return cls


def make_adapter(spec: PoolSpec, workdir: Path) -> PoolAdapter:
    """The adapter for a pool's kind, as `KINDS` declares it."""
    if spec.kind not in KINDS:
        raise PoolError(f"pool '{spec.name}' has unknown kind '{spec.kind}'; the kinds are {', '.join(KINDS)}")
    return adapter_class(spec.kind).for_pool(spec, workdir)
