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
BELOW = {"core": {"schedulers"}, "policy": {"core", "schedulers"}, "model": {"core", "policy", "schedulers"}}
"""Inner layers that an inner layer may not import: the core calls strategies but never imports them (the
server and the simulator pass them in), and the model and the policies know nothing of the core."""


def inner_files():
    return sorted(p for layer in INNER for p in (SRC / layer).rglob("*.py"))


def imported(tree: ast.AST, path: Path):
    """The absolute names of the modules a file imports; relative imports are resolved against its package."""
    package = ["gridbot", *path.relative_to(SRC).parent.parts]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module or ""
            else:
                base = package[:len(package) - node.level + 1]
                if node.module:
                    yield ".".join([*base, node.module])
                else:
                    yield from (".".join([*base, alias.name]) for alias in node.names)


@pytest.mark.parametrize("path", inner_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_inner_layers_import_nothing_impure(path):
    tree = ast.parse(path.read_text())
    allowed = EXEMPT.get(str(path.relative_to(SRC)), set())
    own = path.relative_to(SRC).parts[0]
    for name in imported(tree, path):
        top = name.split(".")[0]
        assert top not in FORBIDDEN_MODULES - allowed, f"{path.name} imports {name}"
        if top == "gridbot":
            layer = name.split(".")[1] if "." in name else ""
            assert layer not in OUTER, f"{path.name} imports the outer layer {name}"
            assert layer not in BELOW.get(own, set()), f"{path.name} ({own}) imports {name}, a layer above it"
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


@pytest.mark.parametrize(("source", "where", "bad"), [
    ("from ..schedulers import registry", "core/x.py", True),
    ("from . import view", "core/x.py", False),
    ("from .. import sim", "core/x.py", True),
    ("import gridbot.schedulers.base", "core/x.py", True),
    ("from gridbot.core import view", "schedulers/x.py", False),
])
def test_the_rule_sees_relative_imports_and_the_core_never_imports_strategies(source, where, bad):
    path = SRC / where
    own = where.split("/")[0]
    names = list(imported(ast.parse(source), path))
    layers = {n.split(".")[1] for n in names if n.startswith("gridbot.")}
    assert bool(layers & (OUTER | BELOW.get(own, set()))) is bad, names
