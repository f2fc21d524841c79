"""Issue 13: a kind of pool is one entry of `KINDS`, which validation, the adapters and the planner read."""

from collections.abc import Sequence

import pytest

from gridbot.model.pools import KINDS, PoolKind, PoolSpec, parse_pools
from gridbot.model.spec import SpecError
from gridbot.model.states import PilotState
from gridbot.pools.adapters import adapter_class, make_adapter
from gridbot.pools.base import PilotRequest, PoolAdapter, PoolError
from gridbot.schedulers.overlay import pool_capacity


class ToyAdapter(PoolAdapter):
    """The adapter of a kind that only this test declares."""

    def submit(self, n: int, pilot: PilotRequest) -> list[str]:
        return [f"toy-{i}" for i in range(n)]

    def status(self, ids: Sequence[str]) -> dict[str, PilotState]:
        return dict.fromkeys(ids, PilotState.RUNNING)

    def cancel(self, ids: Sequence[str]) -> None:
        """Nothing to cancel."""


def problems(text):
    with pytest.raises(SpecError) as info:
        parse_pools(text, "pools.toml")
    return [(p.line, p.message, p.hint) for p in info.value.problems]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_names_an_adapter_class(kind):
    assert issubclass(adapter_class(kind), PoolAdapter)


def test_adding_a_kind_is_one_entry(monkeypatch, tmp_path):
    monkeypatch.setitem(KINDS, "toy", PoolKind("tests.unit.test_pool_kinds:ToyAdapter", ("colour",),
                                               (("colour", 'add colour = "red"'),), queue=False))
    [spec] = parse_pools('[pools.t]\nkind = "toy"\ncolour = "red"\nmax_running = 3\nmax_queued = 0\n', "p.toml")
    assert spec.options == {"colour": "red"} and spec.ad()["Kind"] == "toy"
    assert problems('[pools.t]\nkind = "toy"\n') == [(1, "pool 't' (kind toy) has no colour", 'add colour = "red"')]
    adapter = make_adapter(spec, tmp_path)
    assert isinstance(adapter, ToyAdapter) and adapter.submit(2, PilotRequest("http://s:1")) == ["toy-0", "toy-1"]
    assert pool_capacity(spec, 0, 1, (0, 0), True).new_pilots == 2, "a kind without a queue ignores max_queued"


def test_an_unknown_kind_says_what_to_write():
    assert problems('[pools.a]\nkind = "slurmm"\n') == [(2, "pool 'a' has unknown kind 'slurmm'",
                                                        "did you mean 'slurm'?")]
    [(line, message, hint)] = problems('[pools.a]\nkind = 3\n')
    assert (line, message) == (2, "pool 'a' has unknown kind 3")
    assert hint == f'write kind = "NAME", NAME one of {", ".join(KINDS)}'


def test_a_key_of_another_kind_names_the_kinds_it_belongs_to():
    [(line, message, hint)] = problems('[pools.a]\nkind = "local"\nregion = "us-east-1"\n')
    assert (line, message) == (3, "unknown key 'region' in pool 'a' (kind local)")
    assert hint == "'region' is for pools of kind ec2: remove it, or change this pool's kind"
    [(_, _, hint)] = problems('[pools.a]\nkind = "ec2"\nregion = "r"\ninstance_type = "t"\nimage = "i"\n'
                              'run_as = "u"\nwork_dir = "/x"\n')
    assert hint.startswith("'work_dir' is for pools of kinds slurm, pbs, lsf, cobalt, flux:")


def test_an_unknown_kind_gets_no_adapter(tmp_path):
    with pytest.raises(PoolError, match="pool 'x' has unknown kind 'toy'; the kinds are local, slurm"):
        make_adapter(PoolSpec("x", "toy"), tmp_path)


@pytest.mark.parametrize(("kind", "new_pilots"), [("slurm", 2), ("local", 7), ("static", 0), ("grid", 2)])
def test_the_planner_reads_queues_and_pilots_from_the_kind(kind, new_pilots):
    """`grid` is a simulated pool's kind, not in KINDS: it queues its pilots, as the simulator always had it."""
    spec = PoolSpec("p", kind, max_running=10, max_queued=3)
    assert pool_capacity(spec, 1, 2, (0, 4), True).new_pilots == new_pilots


def test_gridbot_pools_shows_only_the_limits_that_apply_to_the_kind():
    """Found by the walkthrough review of 2026-11-29: a local pool showed "1 run / 10 queue", though max_queued
    does not apply to it (docs/pools.md)."""
    from gridbot.cli.render import _limits
    from gridbot.protocol import PoolInfo

    def info(kind: str) -> PoolInfo:
        return PoolInfo("p", kind, 0, 0, 0, 0, 0, 0, 0, 0.0, "", 4, 10)

    assert [_limits(info(k)) for k in ("slurm", "ec2", "local", "static", "volunteer")] == [
        "4 run / 10 queue", "4 run / 10 queue", "4 run", "-", "-"]


def test_queue_patience_is_a_duration_and_0_means_a_queued_pilot_always_counts():
    [spec] = parse_pools('[pools.c]\nkind = "slurm"\npartition = "p"\nqueue_patience = "90m"\n', "p.toml")
    assert spec.queue_patience == 5400.0
    [spec] = parse_pools('[pools.c]\nkind = "slurm"\npartition = "p"\n', "p.toml")
    assert spec.queue_patience == 0.0
    with pytest.raises(SpecError) as e:
        parse_pools('[pools.c]\nkind = "slurm"\npartition = "p"\nqueue_patience = "-5m"\n', "p.toml")
    assert "queue_patience" in str(e.value) and 'queue_patience = "10m"' in str(e.value), str(e.value)
