"""The state machines: terminal states are final and no transition skips the declared table."""

import ast
from pathlib import Path

import pytest

import gridbot
from gridbot.cli.main import cli
from gridbot.client import TERMINAL_BAG_STATES
from gridbot.model.states import (
    BAG_REOPEN,
    BAG_TERMINAL,
    BAG_TRANSITIONS,
    INSTANCE_TERMINAL,
    INSTANCE_TRANSITIONS,
    JOB_RETRY,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    BagState,
    InstanceState,
    JobState,
    PilotState,
    TransitionError,
    check_transition,
)


@pytest.mark.parametrize(("table", "terminal"), [(BAG_TRANSITIONS, BAG_TERMINAL), (JOB_TRANSITIONS, JOB_TERMINAL),
                                                 (INSTANCE_TRANSITIONS, INSTANCE_TERMINAL)])
def test_terminal_states_have_no_way_out(table, terminal):
    for state, targets in table.items():
        assert (not targets) == (state in terminal), state
    assert set(table) == set(type(next(iter(table)))), "every member has a row"


def test_a_terminal_state_cannot_move():
    with pytest.raises(TransitionError, match="cannot move from done to queued"):
        check_transition(JOB_TRANSITIONS, JobState.DONE, JobState.QUEUED)
    assert check_transition(INSTANCE_TRANSITIONS, InstanceState.OVERDUE, InstanceState.DONE) is InstanceState.DONE


@pytest.mark.parametrize(("table", "terminal"), [(JOB_RETRY, JOB_TERMINAL), (BAG_REOPEN, BAG_TERMINAL)])
def test_the_owners_ways_back_lead_only_out_of_terminal_states(table, terminal):
    """Issue 12: a retry is the only way out of a terminal state, and only into a live one."""
    assert set(table) == set(type(next(iter(table)))), "every member has a row"
    for state, targets in table.items():
        assert not targets or state in terminal, state
        assert not targets & terminal, state
    assert JOB_RETRY[JobState.FAILED] == {JobState.QUEUED} and not JOB_RETRY[JobState.DONE]
    assert not BAG_REOPEN[BagState.CANCELLED]
    with pytest.raises(TransitionError, match="cannot move from cancelled to queued"):
        check_transition(JOB_RETRY, JobState.CANCELLED, JobState.QUEUED)



INITIAL = {BagState: BagState.ACTIVE, JobState: JobState.QUEUED, InstanceState: InstanceState.RUNNING}
STATE_WORDS = {s.value for enum in (BagState, JobState, InstanceState, PilotState) for s in enum}
SPELLED_NOWHERE_ELSE = ("client.py", "results.py", "cli", "server")
"""Where states are compared or listed: they must come from the tables, not be spelled again (issue 13)."""


@pytest.mark.parametrize("table", [BAG_TRANSITIONS, JOB_TRANSITIONS, INSTANCE_TRANSITIONS],
                         ids=["bag", "job", "instance"])
def test_every_state_appears_in_its_transition_table(table):
    enum = type(next(iter(table)))
    assert set(table) == set(enum), "every member has a row"
    reached = set().union(*table.values())
    assert reached | {INITIAL[enum]} == set(enum), "every member but the first is reached by some move"


def test_the_clients_terminal_set_is_the_models():
    assert TERMINAL_BAG_STATES == BAG_TERMINAL
    assert {"completed", "failed", "cancelled"} <= TERMINAL_BAG_STATES  # as the wire spells them (BagInfo.state)
    assert "active" not in TERMINAL_BAG_STATES
    state = next(p for p in cli.commands["jobs"].params if p.name == "state")
    assert list(state.type.choices) == [s.value for s in JobState]


def _spelled_states(path: Path) -> list[str]:
    """State names written as literals in a comparison or in a collection of two or more of them."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            found += [o.value for o in operands if isinstance(o, ast.Constant) and o.value in STATE_WORDS]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) >= 2:
            values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(values) == len(node.elts) and set(values) <= STATE_WORDS:
                found += values
    return [f"{path.name}:{v}" for v in found]


def test_the_client_cli_and_server_do_not_spell_states_again():
    src = Path(gridbot.__file__).parent
    files = [p for name in SPELLED_NOWHERE_ELSE for p in ([src / name] if name.endswith(".py")
                                                          else sorted((src / name).rglob("*.py")))]
    assert len(files) > 5
    assert [s for f in files for s in _spelled_states(f)] == []
