"""The rule that keeps the simulator honest: inner layers never read the clock or do I/O.

model, core, policy and schedulers may import only the standard library's pure modules, msgspec,
and each other; never the outer layers, the clock, the network, the disk or processes.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "gridbot"
INNER = ("model", "core", "policy", "schedulers")
FORBIDDEN_MODULES = {
    "time", "datetime", "os", "sys", "io", "pathlib", "shutil", "socket", "subprocess", "asyncio", "threading",
    "multiprocessing", "sqlite3", "psycopg", "aiohttp", "urllib", "http", "random", "signal", "tempfile", "glob",
    "logging", "requests", "httpx", "boto3", "psij",
}
EXEMPT = {"policy/classad.py": {"os"}}
"""The ClassAd bootstrap sets two environment variables for the C++ library before it loads, nothing else."""
OUTER = {"store", "pools", "server", "worker", "sim", "cli", "web", "client", "protocol"}


def inner_files():
    return sorted(p for layer in INNER for p in (SRC / layer).rglob("*.py"))


def imported(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


@pytest.mark.parametrize("path", inner_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_inner_layers_import_nothing_impure(path):
    tree = ast.parse(path.read_text())
    allowed = EXEMPT.get(str(path.relative_to(SRC)), set())
    for name in imported(tree):
        top = name.split(".")[0]
        assert top not in FORBIDDEN_MODULES - allowed, f"{path.name} imports {name}"
        if top == "gridbot":
            layer = name.split(".")[1] if "." in name else ""
            assert layer not in OUTER, f"{path.name} imports the outer layer {name}"
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not calls & {"open", "print", "input"}, f"{path.name} does I/O"


def test_the_rule_sees_every_inner_layer():
    assert {p.parent.name for p in inner_files()} >= set(INNER)


def test_the_classad_bootstrap_only_sets_environment_defaults():
    tree = ast.parse((SRC / "policy/classad.py").read_text())
    uses = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "os"}
    assert uses == {"os.environ"}
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call) and "os." in ast.unparse(n.func)}
    assert calls == {"os.environ.setdefault"}
