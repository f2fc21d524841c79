"""The EC2 adapter against moto's mock of EC2.

A mock, because no real cloud can run here: this is the one part of gridbot tested against one.
"""

import base64
import importlib.metadata
import subprocess

import boto3
import pytest
from moto import mock_aws

from gridbot.model.pools import parse_pools
from gridbot.model.states import PilotState
from gridbot.pools.adapters import EC2Adapter
from gridbot.pools.base import PilotRequest, PoolError

POOLS = """\
[pools.cloud]
kind = "ec2"
region = "us-east-1"
instance_type = "c5.large"
image = "{image}"
spot = {spot}
cpus = 2
walltime = "2h"
run_as = "ec2-user"
"""


@pytest.fixture
def ec2():
    with mock_aws():
        client = boto3.client("ec2", region_name="us-east-1")
        yield client


def image_id(client):
    return client.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


@pytest.mark.parametrize("spot", ["false", "true"])
def test_start_list_and_terminate_pilots(ec2, spot):
    [spec] = parse_pools(POOLS.format(image=image_id(ec2), spot=spot), "pools.toml")
    pool = EC2Adapter(spec, ec2)
    ids = pool.submit(3, PilotRequest("http://gridbot.example:8470"))
    assert len(ids) == 3
    assert set(pool.status(ids).values()) <= {PilotState.QUEUED, PilotState.RUNNING}
    described = ec2.describe_instances(InstanceIds=ids)["Reservations"][0]["Instances"][0]
    assert described["InstanceType"] == "c5.large"
    assert {"Key": "gridbot-pool", "Value": "cloud"} in described["Tags"]
    data = ec2.describe_instance_attribute(InstanceId=ids[0], Attribute="userData")["UserData"]["Value"]
    script = base64.b64decode(data).decode()
    assert "gridbot worker --server http://gridbot.example:8470 --slots 2 --pool cloud" in script
    assert "--lifetime 6480" in script and "shutdown -h now" in script
    assert "--run-as ec2-user" in script, "the boot script runs as root: its worker runs jobs as the pool's user"
    assert f"pip install --quiet gridbot=={importlib.metadata.version('gridbot')} " in script, \
        "a pilot of another version may not know the options the server starts it with"
    assert script.index("trap 'shutdown -h now' EXIT") < script.index("pip install"), \
        "an install that fails powers the instance off too"
    pool.cancel(ids[:2])
    states = pool.status(ids)
    assert [states[i] for i in ids] == [PilotState.COMPLETED, PilotState.COMPLETED, PilotState.RUNNING]


def test_the_boot_script_powers_the_instance_off_when_the_install_fails(ec2, tmp_path):
    """The boot script itself, run by sh with stand-ins for python3, pip3 and shutdown: an install that fails (a
    version the image's package index lacks) must still power the instance off, or it stays billed while it never
    calls in. The pool's `install` replaces the default requirement."""
    text = POOLS.format(image=image_id(ec2), spot="false") + 'install = "gridbot @ https://example.org/g.whl"\n'
    [spec] = parse_pools(text, "pools.toml")
    script = EC2Adapter(spec, ec2).user_data(PilotRequest("http://x:1"))
    assert "pip install --quiet 'gridbot @ https://example.org/g.whl'" in script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("python3", "echo \"$@\" >> $LOG; exit 1"), ("pip3", "exit 1"),
                       ("shutdown", "echo off >> $LOG")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "log"
    done = subprocess.run(["/bin/sh", "-c", script], env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log)},
                          timeout=30)
    lines = log.read_text().splitlines()
    assert done.returncode != 0 and lines[-1] == "off", lines
    assert not any("gridbot worker" in line for line in lines), "no worker runs without its install"


def test_a_refused_request_is_a_clear_pool_error(ec2):
    text = POOLS.format(image=image_id(ec2), spot="false") + 'subnet = "subnet-nope"\n'
    [spec] = parse_pools(text, "pools.toml")
    pool = EC2Adapter(spec, ec2)
    with pytest.raises(PoolError, match=r"pool 'cloud': EC2 refused to start 1 instances: .*InvalidSubnetID"):
        pool.submit(1, PilotRequest("http://x:1"))


def test_a_restarted_overlay_takes_up_the_instances_it_left_running(ec2, tmp_path):
    """Issue 13: pilots live in the store; a clean stop leaves them running, the next server counts them,
    and one started with --cancel-pilots-on-exit terminates them when it stops."""
    from types import SimpleNamespace

    from gridbot.server.overlay import Overlay
    from gridbot.store.memory import MemoryStore

    [spec] = parse_pools(POOLS.format(image=image_id(ec2), spot="false"), "pools.toml")
    store = MemoryStore()

    def overlay(**kw):
        service = SimpleNamespace(store=store, dispatcher=SimpleNamespace(pool_ads={}))
        return Overlay(service, [spec], "http://gridbot.example:8470", tmp_path, **kw)

    def states(ids):
        found = ec2.describe_instances(InstanceIds=ids)["Reservations"]
        return {i["State"]["Name"] for r in found for i in r["Instances"]}

    first = overlay()
    first.restore()
    first._act({"cloud": 2}, {}, 1.0)
    first.close()
    ids = [p.native_id for p in store.pilots(live=True)]
    assert len(ids) == 2 and states(ids) <= {"pending", "running"}, "a clean stop leaves them running"
    second = overlay(cancel_on_exit=True)
    second.restore()
    pool = second.pools["cloud"]
    assert list(pool.pilots) == ids
    second._observe(pool, second._poll({"cloud": ids}, 2.0)["cloud"], 2.0)
    assert [(r.state, r.started_at) for r in pool.pilots.values()] == [(PilotState.RUNNING, 2.0)] * 2
    second.close()
    assert store.pilots(live=True) == [] and states(ids) <= {"shutting-down", "terminated"}
    assert [r.state for r in store.pilots()] == [PilotState.COMPLETED] * 2, "running pilots asked to stop"


def test_the_overlay_gives_each_instance_an_enrollment_token_of_its_own_not_the_pools_key(ec2, tmp_path):
    """Any process on an instance can read its user data from the metadata service: a job there would find the
    pool's worker key and could register hosts of the pool at will. The overlay writes there a token for that
    instance's one registration, which its worker spends before any job runs (security/keys.py); one token for
    the instances of a launch would let a job on the first to register use what its siblings have not yet."""
    import shlex
    import time
    from types import SimpleNamespace

    from gridbot.security.access import ensure_keys, read_access
    from gridbot.server.overlay import Overlay
    from gridbot.store.memory import MemoryStore

    [spec] = parse_pools(POOLS.format(image=image_id(ec2), spot="false"), "pools.toml")
    access = ensure_keys(tmp_path / "access.json", tmp_path / "keys.json", [spec], "http://gridbot.example:8470",
                         "", time.time())
    service = SimpleNamespace(store=MemoryStore(), dispatcher=SimpleNamespace(pool_ads={}))
    overlay = Overlay(service, [spec], "http://gridbot.example:8470", tmp_path, access=access)
    overlay.restore()
    overlay._act({"cloud": 2}, {}, time.time())
    ids = [p.native_id for p in service.store.pilots(live=True)]
    assert len(ids) == 2
    key = read_access(tmp_path / "access.json").workers["cloud"]
    tokens = set()
    for i in ids:
        script = base64.b64decode(ec2.describe_instance_attribute(InstanceId=i, Attribute="userData")[
            "UserData"]["Value"]).decode()
        assert key not in script and key.split(".")[2] not in script, "the pool's worker key is not in user data"
        [line] = [x for x in script.splitlines() if x.startswith("export GRIDBOT_WORKER_KEY=")]
        tokens.add(shlex.split(line.split("=", 1)[1])[0])
    assert len(tokens) == 2, "a token per instance"
    for token in tokens:
        principal = access.auth.authenticate(token)
        assert principal is not None and (principal.role, principal.name, principal.uses) == ("worker", "cloud", 1)
        spend = MemoryStore().spend_enrollment
        assert [access.auth.enroll(principal, time.time(), spend) for _ in range(2)] == [True, False]
    overlay.close()
