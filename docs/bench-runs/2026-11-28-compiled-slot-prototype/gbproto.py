"""Prototype only: the slot thread's common case through _fastslot (C), when GRIDBOT_PROTO=1."""
import os

def _available():
    try:
        import gridbot.worker.worker  # noqa: F401
        return True
    except ImportError:  # another interpreter (the peers' virtualenv)
        return False


if os.environ.get("GRIDBOT_PROTO") == "1" and _available():
    import time

    import _fastslot
    from gridbot.model.records import InstanceReport, Outcome
    from gridbot.worker import executor as ex
    from gridbot.worker import worker as wk

    orig = ex.run_blocking
    _enc: dict[int, list[bytes]] = {}

    def fast(a, jobdir, max_result_bytes, stop, wake, started_cb, stop_reason, base_env, keep=True,
             reaped_cb=lambda: False):
        if a.timeout is not None or a.limits is not None or a.outputs or keep or base_env is None or (a.env and a.env.keys() & base_env.keys()):
            return orig(a, jobdir, max_result_bytes, stop, wake, started_cb, stop_reason, base_env, keep, reaped_cb)
        started = time.monotonic()
        fs = ex._fs
        emptied, fs.emptied, fs.ran = getattr(fs, "emptied", None), None, None
        st = ex.slot_dir(jobdir)
        if not ex._cwd_here(jobdir, st):
            return orig(a, jobdir, max_result_bytes, stop, wake, started_cb, stop_reason, base_env, keep, reaped_cb)
        this = (jobdir, st.st_dev, st.st_ino)
        base = _enc.get(id(base_env))
        if base is None:
            base = _enc[id(base_env)] = [f"{k}={v}".encode() for k, v in base_env.items()]
        envp = [*base, *[f"{k}={v}".encode() for k, v in a.env.items()], b"GRIDBOT_JOB_INDEX=%d" % a.index, b"GRIDBOT_JOB_ID=%d" % a.job_id,
                b"GRIDBOT_INSTANCE=%d" % a.instance_id, b"GRIDBOT_BAG=" + a.bag_name.encode(),
                b"GRIDBOT_CPUS=%d" % a.cpus]
        argv = ex.plain_argv(a.command)
        if argv is None or "/" in argv[0]:
            return orig(a, jobdir, max_result_bytes, stop, wake, started_cb, stop_reason, base_env, keep, reaped_cb)
        found = ex._find(argv[0], base_env.get("PATH", os.defpath))
        if found is None:
            return orig(a, jobdir, max_result_bytes, stop, wake, started_cb, stop_reason, base_env, keep, reaped_cb)
        flags = ex._EMPTY_FLAGS if emptied == this else ex._OUTPUT_FLAGS
        with ex.SPAWN_LOCK:
            if stop.is_set():
                reason = ex._stop_cause(stop, stop_reason)
                return ex._unstarted(a, started, reason or "the worker stopped",
                                     Outcome.FAILURE if reason else Outcome.INTERRUPTED)
            try:
                pid = _fastslot.spawn(found.encode(), [w.encode() for w in argv], envp, b".gridbot-stdout",
                                      b".gridbot-stderr", flags)
            except OSError:
                pid = 0
            if pid:
                started_cb(pid)
        if not pid:  # not executable, or an output file refused: the shell and run_blocking have their say
            return orig(a, jobdir, max_result_bytes, stop, wake, started_cb, stop_reason, base_env, keep, reaped_cb)
        waiting = ex._Waiting(pid, stop)
        stop.on_set(waiting.stop)
        try:
            _fastslot.wait(pid)
        finally:
            why = waiting.ended()
            code, cpu = _fastslot.reap(pid)
            left = reaped_cb()
        out, err, clean = _fastslot.finish(str(jobdir).encode(), b".gridbot-stdout", b".gridbot-stderr", ex.TAIL_BYTES)
        if code == 0 and not why and len(out) + len(err) <= max_result_bytes:
            report = InstanceReport(a.instance_id, Outcome.SUCCESS, code, time.monotonic() - started, cpu, "", out,
                                    err, {})
        else:
            report = ex._verdict(a, jobdir, why, stop, stop_reason, code, cpu, max_result_bytes, started, True)
        if clean is None:
            clean = ex.clean_dir(jobdir)
        if clean and not left:
            fs.emptied = this
        return report

    ex.run_blocking = fast
    wk.run_blocking = fast
