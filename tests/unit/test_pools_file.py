"""The pools file: what a user writes and the errors they get."""

import pytest

from gridbot.model.pools import parse_pools
from gridbot.model.spec import SpecError

GOOD = """\
[pools.here]
kind = "local"
max_running = 2
max_queued = 0

[pools.fast]
kind = "slurm"
partition = "fast"
cpus = 2
walltime = "1h"
reliability = "reliable"
level = 1
[pools.fast.attributes]
Site = "technion"

[pools.cloud]
kind = "ec2"
region = "us-east-1"
instance_type = "c5.large"
image = "ami-12345678"
spot = true
price_per_cpu_hour = 0.05
charging_period = "1h"
run_as = "ec2-user"
"""


def test_a_good_pools_file():
    here, fast, cloud = parse_pools(GOOD, "pools.toml")
    assert (here.kind, here.max_running, here.max_queued) == ("local", 2, 0)
    assert fast.options == {"partition": "fast"} and fast.walltime == 3600 and fast.cpus == 2
    assert fast.ad()["Site"] == "technion" and fast.ad()["Level"] == 1 and fast.ad()["Kind"] == "slurm"
    assert cloud.options["spot"] is True and cloud.price_per_cpu_hour == 0.05
    assert (here.min_cpu, here.cpu_window) == (0.05, 600.0), "pilots leave a host that starves their job"


@pytest.mark.parametrize(("text", "line", "needle"), [
    ('[pools.a]\nkind = "slurmm"\n', 2, "did you mean 'slurm'?"),
    ('[pools.a]\nkind = "slurm"\n', 1, "has no partition"),
    ('[pools.a]\nkind = "local"\nmax_runing = 2\n', 3, "did you mean 'max_running'?"),
    ('[pools.a]\nkind = "local"\nmax_running = -1\n', 3, "from 0 to 10,000,000"),
    # found by the bad-input hunt: a 23-digit number passed, then broke /v1/pools (500) and the overlay's step
    ('[pools.a]\nkind = "local"\nmax_running = 99999999999999999999999\n', 3, "from 0 to 10,000,000"),
    ('[pools.a]\nkind = "local"\nmax_queued = 99999999999999999999999\n', 3, "from 0 to 10,000,000"),
    ('[pools.a]\nkind = "local"\ncpus = 99999999999\n', 3, "from 1 to 65,536"),
    ('[pools.a]\nkind = "static"\nmemory_mb = 99999999999999999999999\n', 3, "from 0 to 1,000,000,000,000"),
    ('[pools.a]\nkind = "static"\n[pools.a.attributes]\nBig = 99999999999999999999999\n', 4,
     "beyond what a ClassAd integer holds"),
    ('[pools.a]\nkind = "static"\n[pools.a.attributes]\nkind = "ec2"\n', 4, "the pool's own ad attribute"),
    ('[pools.a]\nkind = "local"\nwalltime = "forever"\n', 3, "duration"),
    ('[pools.a]\nkind = "local"\nreliability = "flaky"\n', 3, "use one of unreliable, reliable, volunteer"),
    ('[pools.a]\nkind = "ec2"\nregion = "x"\n', 1, "has no instance_type"),
    ('[pools.a]\nkind = "local"\npartition = "x"\n', 3, "unknown key 'partition'"),
    ('[pools.a]\nkind = "local"\nmin_cpu = 5\n', 3, "fraction from 0 to 1"),
    ('[pools.a]\nkind = "local"\ncpu_window = 0.5\n', 3, "must be at least 1 s, not 0.5"),
    ('[pools.a]\nkind = "local"\ncpu_window = 0\n', 3, "a duration must be positive"),
    ('[pools.a]\nkind = "local"\ncharging_period = 0\n', 3, "a duration must be positive"),
    ('[pools.a]\nkind = "local"\nrun_as = "a b"\n', 3, "must be a user name"),
    ('[pools.a]\nkind = "local"\nallow_root = "yes"\n', 3, "must be true or false"),
    ('[pools.a]\nkind = "ec2"\nregion = "x"\ninstance_type = "t"\nimage = "i"\n', 1, "or allow_root = true"),
    ('[pools.a]\nkind = "ec2"\nregion = "x"\ninstance_type = "t"\nimage = "i"\nallow_root = true\ninstall = 3\n', 1,
     "install must be what pip installs"),
    ("[pool.a]\n", 1, "unknown key 'pool'"),
    ("", None, "no pools are defined"),
])
def test_bad_pools_files(text, line, needle):
    with pytest.raises(SpecError) as info:
        parse_pools(text, "pools.toml")
    found = [(p.line, p.message + " " + p.hint) for p in info.value.problems]
    assert any(needle in m and ln == line for ln, m in found), found


def test_zero_means_never_where_the_docs_say_so():
    """Found by the docs review of 2026-11-29: docs/pools.md gave `idle_timeout = 0` (keep idle pilots) and
    `monitor_interval = 0` (never read) and PoolSpec meant them, but the file refused every zero duration."""
    (a,) = parse_pools('[pools.a]\nkind = "slurm"\npartition = "p"\nwalltime = 0\nidle_timeout = "0m"\n'
                       'monitor_interval = 0\n', "pools.toml")
    assert (a.walltime, a.idle_timeout, a.monitor_interval) == (0.0, 0.0, 0.0)
    from gridbot.pools.base import PilotRequest

    args = PilotRequest("http://s:1").worker_args(a)
    assert args[args.index("--idle-timeout") + 1] == "0" and "--lifetime" not in args
    assert args[args.index("--give-up-after") + 1] != "0", "a pilot without walltime still gives up, after a day"


def test_pilots_of_a_pool_get_its_run_as_and_allow_root():
    """Issue "security", job isolation: a worker started as root refuses to run jobs without one of them."""
    from gridbot.pools.base import PilotRequest

    here, fast, cloud = parse_pools(GOOD.replace('max_queued = 0\n', 'max_queued = 0\nallow_root = true\n'),
                                    "pools.toml")
    assert (here.allow_root, here.run_as, cloud.run_as) == (True, "", "ec2-user")
    assert PilotRequest("http://s:1").worker_args(here)[-1] == "--allow-root"
    args = PilotRequest("http://s:1").worker_args(cloud)
    assert args[args.index("--run-as") + 1] == "ec2-user" and "--allow-root" not in args
    assert "--run-as" not in PilotRequest("http://s:1").worker_args(fast)
    assert "--leave-when-refused" in args, "a pilot every bag refuses leaves at once (GridBot's pilot suicide)"


@pytest.mark.parametrize("name", ["a/b", "a\nb", "", "-x", "x" * 65])
def test_a_pool_name_that_names_nothing_safely_is_refused(name):
    """Found by the command-line review of 2026-11-27: `[pools."a/b"]`, a name with a line break, or an empty one
    were accepted and given worker keys (`gridbot access show` printed a line broken in two)."""
    quoted = name.replace("\n", "\\n")
    with pytest.raises(SpecError, match="is not allowed"):
        parse_pools(f'[pools."{quoted}"]\nkind = "local"\n', "pools.toml")


def test_a_pools_startup_is_in_its_ad_else_its_kinds():
    """ExPERT's estimate adds it to the instances it sends to a reliable pool whose pilots are not up yet."""
    pools = {p.name: p for p in parse_pools(
        '[pools.mine]\nkind = "local"\n[pools.warm]\nkind = "local"\nstartup = "0.0m"\n'
        '[pools.cluster]\nkind = "slurm"\npartition = "p"\nstartup = "10m"\n[pools.lab]\nkind = "static"\n', "p.toml")}
    assert {name: p.ad()["Startup"] for name, p in pools.items()} == {"mine": 5.0, "warm": 0.0, "cluster": 600.0,
                                                                      "lab": 0.0}
    for value, needle in (("-3", "a duration must be positive"), ("false", "a duration is a number of seconds"),
                          ('"soon"', "a duration is a number of seconds or a string")):
        with pytest.raises(SpecError) as e:
            parse_pools(f'[pools.mine]\nkind = "local"\nstartup = {value}\n', "p.toml")
        assert f"p.toml:3: 'startup' of pool 'mine': {needle}" in str(e.value)
        assert 'write startup = "90s" (0: no wait)' in str(e.value)
    with pytest.raises(SpecError, match="attribute 'Startup' of pool 'mine' is the pool's own ad attribute"):
        parse_pools('[pools.mine]\nkind = "local"\n[pools.mine.attributes]\nStartup = 1\n', "p.toml")


def test_a_batch_pilot_without_walltime_asks_no_limit_and_kinds_that_need_one_refuse_0(tmp_path):
    """Found by the review of 2026-11-29: `walltime = 0` on a Slurm pool made PSI/J's typed constructor refuse
    every pilot (duration None); LSF's, Cobalt's and Flux's executors need a duration, so 0 is refused there."""
    from gridbot.pools.adapters import BatchAdapter
    from gridbot.pools.base import PilotRequest

    (none, four) = parse_pools('[pools.a]\nkind = "slurm"\npartition = "p"\nwalltime = 0\n'
                               '[pools.b]\nkind = "slurm"\npartition = "p"\nwalltime = "4h"\n', "pools.toml")
    for spec, want in ((none, None), (four, 4 * 3600.0)):
        adapter = BatchAdapter(spec, tmp_path)
        sent = []
        adapter.executor.submit = lambda job, sent=sent: (sent.append(job), setattr(job, "_native_id", "1"))
        adapter.submit(1, PilotRequest("http://s:1"))
        duration = sent[0].spec.attributes.duration
        assert (duration.total_seconds() if duration is not None else None) == want
    for kind in ("lsf", "cobalt", "flux"):
        with pytest.raises(SpecError, match=f"cannot be 0 for kind '{kind}'"):
            parse_pools(f'[pools.a]\nkind = "{kind}"\npartition = "p"\nwalltime = 0\n', "pools.toml")
