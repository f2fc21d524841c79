"""Nimrod/G plan files, translated into gridbot's bag spec.

Nimrod/G describes a parameter sweep in a *plan file* (Buyya, Murshed, Abramson and Venugopal, SPE 2005,
Section 6 and Figure 9): `parameter` statements define the axes, and `task main ... endtask` says what each
job does: copy files to the node, run commands there, copy the results back. `gridbot run sweep.pln` takes
such a file, so that a Nimrod user's plans run unchanged. It is translated here into the TOML of the
equivalent spec, which `parse_spec` then validates: a plan file meets every check a TOML spec meets and
makes the very same bag, and problems point at the plan's own lines. What of the language gridbot cannot
honour is an error that names its line and what to write instead, never skipped. Pure: the caller reads
the file.

The mapping (docs/spec.md, "Nimrod plan files"):

- `parameter x integer range from 1 to 200 step 1;` is `x = { from = 1, to = 200, step = 1 }`; with
  `points N` instead of `step`, N evenly spaced values; `default V` is the one value V; `select anyof A B`
  the values A and B; `select oneof A B [default B]` one value, the default or else the first. A `label`
  names the parameter in Nimrod's user interface: it is kept as a comment.
- `copy SRC node:DEST` makes SRC (relative to the plan's folder) an input. Inputs are staged under their
  base name and without their mode, so the command copies it to DEST when the names differ, and makes DEST
  executable when a `node:execute` line runs it (`./DEST`).
- `node:execute CMD` (or `shexec "CMD"`) is the command; several are joined with ` && `, in order, so the
  first that fails fails the job, as Nimrod's default `onerror fail` does.
- `copy node:SRC DEST` makes SRC an output. It lands in `results/<bag>/<job>/SRC`: the job's own folder
  takes the place of DEST, whose `.$jobname` only kept the jobs' files apart.
- `$x` and `${x}` are the placeholder `{x}`; `$jobname` (or `$jobindex`) in a command is the job's index,
  `$GRIDBOT_JOB_INDEX`; `$$` is a `$` for the shell.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from itertools import product

from gridbot.model.spec import (
    DEFAULT_MAX_JOBS,
    RANGE_LIMIT,
    BagSpec,
    Parameter,
    Problem,
    SpecError,
    closest,
    output_name_problem,
    parameter_name_issue,
    parse_spec,
    placeholders,
    range_issue,
)

PLAN_SUFFIX = ".pln"
"""Files ending so are plan files, not TOML (`gridbot run`, `gridbot submit`, `Client.submit_file`)."""
TYPES = ("integer", "float", "text")
DOMAINS = ("default", "range", "select")
TOP_STATEMENTS = ("parameter", "task")
TASK_STATEMENTS = ("copy", "node:execute", "shexec", "onerror", "endtask")
JOB_INDEX = ("jobname", "jobindex")
"""Nimrod's names for the job itself; in a command they become gridbot's job index."""
MAX_STAGED = 1_000
"""Files one `copy $x node:...` may stage: every job receives all of them."""
MAX_POINTS = 100_000
"""Values `range ... points N` may list when they are not a range of exact decimals."""

_UNSUPPORTED = {
    "random": "gridbot's bags are reproducible: list the values with select anyof, or draw them in the "
              "command from the job's index ($jobname)",
    "compute": "compute the value in the command, e.g. with the shell's $((...))",
    "files": "list the file names with: parameter NAME text select anyof \"a.dat\" \"b.dat\", and copy $NAME "
             "to the node",
    "execute": "it runs on the home machine, and gridbot runs everything on the node: write node:execute, "
               "or run it before gridbot",
    "exec": "write node:execute CMD",
    "lexec": "write node:execute CMD",
    "lpexec": "write node:execute CMD",
    "node:substitute": "write the values into the file in the command (e.g. with sed), or pass them as "
                       "arguments",
    "redirect": "gridbot keeps each job's stdout and stderr in results/<bag>/<job>/; to write them to a file, "
                "redirect in the command with > FILE",
    "variable": "define it with parameter NAME ... select anyof ...",
    "jobs": "gridbot makes every combination of the parameters; list only the values wanted",
    "props": "give resources in the pools file, and limits with --policy or a TOML spec",
}
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|;|[^\s";]+|"')
_ARG = re.compile(r'"(?:[^"\\]|\\.)*"|[^\s"]+|"')
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,3})?", re.ASCII)
_DOLLAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$\{|\$([A-Za-z_][A-Za-z0-9_]*)|[{}]")
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_./=:,+@%-]+")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}


@dataclass
class _Axis:
    """One `parameter` statement, as the TOML value it becomes."""

    name: str
    line: int
    value: str
    """The TOML value: an inline range table or a list."""
    parameter: Parameter
    """The same axis as gridbot renders it, to expand `copy $x node:...`."""
    label: str = ""


@dataclass
class _Task:
    """What `task main` says, in order: the shell steps of each statement, inputs and outputs."""

    line: int
    steps: list[list[str]] = field(default_factory=list)
    inputs: dict[str, int] = field(default_factory=dict)
    """Each input's path, with the line that copies it."""
    outputs: dict[str, int] = field(default_factory=dict)
    node_files: dict[str, int] = field(default_factory=dict)
    """Each file copied to the node (its name there), with the index of its statement's steps."""
    programs: list[str] = field(default_factory=list)
    """First word of each command: a copied file run as `./NAME` is made executable."""
    executes: list[int] = field(default_factory=list)
    ended: bool = False


def plan_to_toml(text: str, source: str) -> str:
    """The TOML spec equivalent to the plan file `text` (read from `source`), or SpecError naming every
    problem with its line. The bag's name is not set: as for a TOML spec, it is the file's stem."""
    return "".join(f"{toml}\n" for toml, _ in _Translator(source).translate(text))


def parse_plan(text: str, source: str, default_name: str, max_jobs: int = DEFAULT_MAX_JOBS) -> BagSpec:
    """Validate a plan file into the BagSpec its TOML translation makes, or raise SpecError, with the lines
    of the plan file (not of the TOML) in every problem."""
    lines = _Translator(source).translate(text)
    try:
        return parse_spec("".join(f"{toml}\n" for toml, _ in lines), source, default_name, max_jobs)
    except SpecError as e:
        where = {n: line for n, (_, line) in enumerate(lines, 1)}
        raise SpecError(source, [Problem(p.message, where.get(p.line or 0), p.hint) for p in e.problems]) from None


class _Translator:
    """Reads one plan file, collecting every problem with its line, and writes its TOML."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []
        self.axes: dict[str, _Axis] = {}
        self.broken: dict[str, int] = {}
        """Parameters whose statement is a problem, with its line: a use of one is no second problem."""
        self.task: _Task | None = None

    def fail(self, line: int | None, message: str, hint: str = "") -> None:
        self.problems.append(Problem(message, line, hint))

    def translate(self, text: str) -> list[tuple[str, int | None]]:
        """TOML lines, each with the plan's line it comes from (for the problems `parse_spec` finds)."""
        statements = _statements(text)
        for number, line in statements:
            if line.split(None, 1)[0] == "parameter":
                self.parameter(number, line)
        current: _Task | None = None
        for number, line in statements:
            keyword = line.split(None, 1)[0]
            if current is not None and not current.ended:
                if keyword in TOP_STATEMENTS:
                    self.fail(number, f"'{keyword}' inside the task of line {current.line}",
                              "end the task with a line 'endtask' first")
                elif current is self.task or keyword == "endtask":
                    self.task_statement(current, number, line)
            elif keyword == "task":
                current = self.begin_task(number, line)
            elif keyword == "endtask":
                self.fail(number, "endtask without a task", "begin the task with a line 'task main'")
            elif keyword != "parameter":
                self.unknown(number, keyword, TOP_STATEMENTS, "a plan file has parameter statements, then "
                             "task main ... endtask")
        if current is not None and not current.ended:
            self.fail(current.line, "the task has no 'endtask'", "end it with a line 'endtask'")
        if self.task is None:
            self.fail(None, "the plan file has no 'task main'",
                      "add: task main, a line node:execute COMMAND, and endtask")
        elif self.task.ended:
            self.check_task(self.task)
        if self.problems:
            raise SpecError(self.source, self.problems)
        assert self.task is not None
        return self.toml(self.task)

    # -- parameters -----------------------------------------------------------------------------------

    def parameter(self, line: int, text: str) -> None:
        """`parameter NAME [label "..."] TYPE DOMAIN [;]`."""
        tokens = self.tokens(line, text)
        if tokens is None:  # (an unclosed quote): its name, if it has one, is no second problem where used
            name = [*text.split(None, 2), ""][1]
            if not parameter_name_issue(name) and name not in self.axes:
                self.broken.setdefault(name, line)
            return
        words = tokens[1:]
        if not words:
            self.fail(line, "a parameter needs a name, a type and its values",
                      "write: parameter x integer range from 1 to 10 step 1;")
            return
        name, words = words[0], words[1:]
        if issue := parameter_name_issue(name):
            self.fail(line, *issue)
            return
        if name in self.axes:
            self.fail(line, f"parameter '{name}' is defined twice (first at line {self.axes[name].line})",
                      "give each parameter one name")
            return
        self.broken[name] = line  # until its values are read
        label = ""
        if words[:1] == ["label"]:
            if len(words) < 2 or not words[1].startswith('"'):
                self.fail(line, f"the label of parameter '{name}' must be a quoted string", 'label "Length"')
                return
            label, words = _unquote(words[1]), words[2:]
        if not words or words[0] not in TYPES:
            self.type_problem(line, name, words[0] if words else "")
            return
        kind, domain = words[0], words[1:]
        axis = self.domain(line, name, kind, domain)
        if axis is not None:
            axis.label = label
            self.axes[name] = axis
            del self.broken[name]

    def type_problem(self, line: int, name: str, word: str) -> None:
        if word in _UNSUPPORTED:
            self.fail(line, f"parameter '{name}': type '{word}' is not supported", _UNSUPPORTED[word])
        elif not word:
            self.fail(line, f"parameter '{name}' has no type", f"write: parameter {name} integer default 1;")
        else:
            self.fail(line, f"parameter '{name}': unknown type '{word}'",
                      closest(word, TYPES) or f"the types are {', '.join(TYPES)}")

    def domain(self, line: int, name: str, kind: str, words: list[str]) -> _Axis | None:
        """The values of a parameter: `default V`, `range from A to B [step S | points N]`, `select anyof V...`
        or `select oneof V... [default V]`."""
        head = words[0] if words else ""
        if head == "default":
            values = self.values(line, name, kind, words[1:])
            if values is not None and len(values) != 1:
                self.fail(line, f"parameter '{name}': 'default' takes one value, not {len(values)}",
                          "use select anyof to sweep several values")
                return None
            return self.listed(line, name, values)
        if head == "range":
            return self.range(line, name, kind, words[1:])
        if head == "select" and words[1:2] in (["anyof"], ["oneof"]):
            return self.select(line, name, kind, words[1], words[2:])
        if head in _UNSUPPORTED:
            self.fail(line, f"parameter '{name}': '{head}' is not supported", _UNSUPPORTED[head])
        elif head == "select":
            self.fail(line, f"parameter '{name}': select must be followed by anyof or oneof",
                      f'write: parameter {name} {kind} select anyof "a" "b";')
        else:
            usage = f"write default V, range from A to B step S, or select anyof V1 V2 after '{kind}'"
            if head:
                self.fail(line, f"parameter '{name}': unknown '{head}'", closest(head, DOMAINS) or usage)
            else:
                self.fail(line, f"parameter '{name}' has no values", usage)
        return None

    def select(self, line: int, name: str, kind: str, which: str, words: list[str]) -> _Axis | None:
        chosen: list[str] | None = None
        if "default" in words:
            at = words.index("default")
            words, default = words[:at], words[at + 1:]
            if which == "anyof":
                self.fail(line, f"parameter '{name}': 'default' after select anyof picks values in Nimrod's "
                          "user interface, which gridbot has not", "list only the values to sweep after anyof")
                return None
            chosen = self.values(line, name, kind, default)
            if chosen is None:
                return None
            if len(chosen) != 1:
                self.fail(line, f"parameter '{name}': 'default' takes one value, not {len(chosen)}", "")
                return None
        values = self.values(line, name, kind, words)
        if values is None:
            return None
        if not values:
            self.fail(line, f"parameter '{name}': select {which} lists no values", 'write: select anyof "a" "b"')
            return None
        if chosen is not None and chosen[0] not in values:
            self.fail(line, f"parameter '{name}': the default {chosen[0]} is not one of the values",
                      "add it to the values after oneof, or choose one of them")
            return None
        if which == "oneof":
            values = chosen or values[:1]
        return self.listed(line, name, values)

    def values(self, line: int, name: str, kind: str, words: list[str]) -> list[str] | None:
        """The TOML literals of a list of values of type `kind`, or None (a problem is recorded)."""
        out = []
        for word in words:
            if kind == "text":
                out.append(_toml_string(_unquote(word) if word.startswith('"') else word))
                continue
            number = _number(_unquote(word) if word.startswith('"') else word)
            if number is None or (kind == "integer" and number != number.to_integral_value()):
                what = "a whole number" if kind == "integer" else "a number"
                self.fail(line, f"parameter '{name}' is {kind}: {word!r} is not {what}",
                          "declare it text to use words" if number is None else "declare it float")
                return None
            out.append(_toml_number(number))
        return out

    def listed(self, line: int, name: str, literals: list[str] | None) -> _Axis | None:
        if literals is None:
            return None
        rendered = [_render_literal(v) for v in literals]
        return _Axis(name, line, f"[{', '.join(literals)}]", Parameter(name, values=rendered))

    def range(self, line: int, name: str, kind: str, words: list[str]) -> _Axis | None:
        """`range from A to B [step S | points N]` (step 1 when neither is given)."""
        usage = f"write: parameter {name} {kind} range from 1 to 10 step 1;"
        if len(words) not in (4, 6) or words[0] != "from" or words[2] != "to" or \
                (len(words) == 6 and words[4] not in ("step", "points")):
            self.fail(line, f"parameter '{name}': a range is 'range from A to B step S'", usage)
            return None
        if kind == "text":
            self.fail(line, f"parameter '{name}' is text: a range needs numbers", "declare it integer or float")
            return None
        numbers: dict[str, Decimal] = {}
        for key, word in zip(("from", "to", *words[4:5]), words[1::2], strict=True):
            if (number := _number(word)) is None:
                self.fail(line, f"parameter '{name}': '{key}' must be a number, not {word!r}", usage)
                return None
            numbers[key] = number
        start, stop = numbers["from"], numbers["to"]
        if "points" in numbers:
            return self.points(line, name, kind, start, stop, numbers["points"])
        step = numbers.get("step", Decimal(1))
        if kind == "integer":
            for key, n in (("from", start), ("to", stop), ("step", step)):
                if n != n.to_integral_value():
                    self.fail(line, f"parameter '{name}' is integer: '{key}' {n} is not a whole number",
                              "declare it float")
                    return None
        if issue := range_issue(name, start, stop, step):
            self.fail(line, *issue)
            return None
        return _range_axis(name, line, start, stop, step)

    def points(self, line: int, name: str, kind: str, start: Decimal, stop: Decimal, count: Decimal) -> _Axis | None:
        """`range from A to B points N`: N values from A to B, evenly spaced (a range when they are exact)."""
        if count != count.to_integral_value() or not 1 <= count <= MAX_POINTS:
            self.fail(line, f"parameter '{name}': points must be a whole number from 1 to {MAX_POINTS:,}",
                      "or give a step")
            return None
        if max(abs(start), abs(stop)) > RANGE_LIMIT:
            self.fail(line, f"parameter '{name}': a range's numbers are at most 1e18 in size", "")
            return None
        n = int(count)
        with localcontext() as ctx:
            ctx.prec = 60
            step = (stop - start) / (n - 1) if n > 1 else Decimal(0)
            values = [start + step * i for i in range(n)]
            exact = step != 0 and step * (n - 1) == stop - start
        if kind == "integer" and any(v != v.to_integral_value() for v in values):
            self.fail(line, f"parameter '{name}' is integer, but {n} points from {start} to {stop} are not whole "
                      "numbers", "declare it float, or give a step")
            return None
        if exact and range_issue(name, start, stop, step) is None:
            return _range_axis(name, line, start, stop, step)
        with localcontext() as ctx:
            ctx.prec = 15
            return self.listed(line, name, [_toml_number(+v) for v in values])

    # -- the task -------------------------------------------------------------------------------------

    def begin_task(self, line: int, text: str) -> _Task:
        """`task main`; any other task is a problem, and its statements are skipped up to its endtask."""
        words = text.split()
        task = _Task(line)
        if words[1:] != ["main"]:
            name = " ".join(words[1:])
            self.fail(line, f"task '{name}' is not supported" if name else "a task needs a name",
                      "gridbot runs only task main, once per job: put the commands of other tasks in it")
        elif self.task is not None:
            self.fail(line, f"task main is defined twice (first at line {self.task.line})", "keep one")
        else:
            self.task = task
        return task

    def task_statement(self, task: _Task, line: int, text: str) -> None:
        keyword, rest = [*text.split(None, 1), ""][:2]
        if keyword == "endtask":
            if rest:
                self.fail(line, "text after 'endtask'", "write endtask alone on its line")
            task.ended = True
        elif keyword == "node:execute":
            self.execute(task, line, rest)
        elif keyword == "shexec":
            args = self.args(line, rest)
            if args is not None and (len(args) != 1 or not args[0].startswith('"')):
                self.fail(line, "shexec takes one quoted command", 'shexec "./model $x > out"')
            elif args is not None:
                self.execute(task, line, _unquote(args[0]))
        elif keyword == "copy":
            self.copy(task, line, rest)
        elif keyword == "onerror":
            if rest != "fail":
                self.fail(line, f"onerror {rest} is not supported" if rest else "onerror needs fail or ignore",
                          "a failing command fails the job (onerror fail); to go on after one, append "
                          "'|| true' to it")
        else:
            self.unknown(line, keyword, TASK_STATEMENTS, "task main holds copy, node:execute and endtask")

    def execute(self, task: _Task, line: int, command: str) -> None:
        if not command:
            self.fail(line, "node:execute runs nothing", "write the command after node:execute")
            return
        template = self.template(command, line, "command")
        task.steps.append([template])
        task.executes.append(line)
        task.programs.extend(template.split()[:1])

    def copy(self, task: _Task, line: int, rest: str) -> None:
        """`copy SRC node:DEST` (an input), `copy node:SRC DEST` (an output) or `copy node:A node:B`."""
        args = self.args(line, rest)
        if args is None:
            return
        if len(args) != 2:
            self.fail(line, f"copy takes a source and a destination, not {len(args)} names",
                      "copy model node:model, or copy node:output output.$jobname")
            return
        (src_node, src), (dest_node, dest) = (_side(_unquote(a) if a.startswith('"') else a) for a in args)
        if not src_node and not dest_node:
            self.fail(line, "copy between two files of the home machine",
                      "one side must be on the node: node:NAME; copy home files before running the bag")
        elif not src_node:
            self.copy_in(task, line, src, dest)
        elif not dest_node:
            name = self.template(src, line, "output")
            if problem := output_name_problem(name) or ("" if name not in task.outputs else
                                                        f"node:{src} is already copied back at line "
                                                        f"{task.outputs[name]}"):
                self.fail(line, problem, "name a file in the job's directory, once")
            else:
                task.outputs[name] = line
            self.template(dest, line, "home")
        else:
            source = self.node_path(self.template(src, line, "node"), line)
            target = self.node_path(_node_dest(self.template(dest, line, "node"), source), line)
            task.steps.append(_cp(source, target))

    def copy_in(self, task: _Task, line: int, src: str, dest: str) -> None:
        """An input file, staged under its base name, then copied to its name on the node if that differs."""
        template = self.template(src, line, "input")
        base = template.rstrip("/").rsplit("/", 1)[-1]
        target = self.node_path(_node_dest(self.template(dest, line, "node"), base), line)
        for path in self.expand(template, line):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            first = next((p for p in task.inputs if p.rstrip("/").rsplit("/", 1)[-1] == name and p != path), None)
            if first is not None:
                self.fail(line, f"{path} and {first} (line {task.inputs[first]}) would both be staged as {name}",
                          "rename one of them")
                return
            task.inputs.setdefault(path, line)
        task.node_files[target] = len(task.steps)
        task.steps.append([] if target == base else _cp(base, target))

    def expand(self, template: str, line: int) -> list[str]:
        """Every path `template` names over the values of the parameters in it (a plain path: itself)."""
        names = list(dict.fromkeys(placeholders(template)))
        axes = [self.axes[n].parameter for n in names if n in self.axes]
        total = 1
        for p in axes:
            total *= p.size
        if total > MAX_STAGED:
            self.fail(line, f"copying {_as_written(template)} to the node stages {total:,} files in every job, over "
                      f"the limit of {MAX_STAGED:,}", "copy a folder or an archive, and pick the file in the "
                      "command")
            return []
        return list(dict.fromkeys(template.format_map(dict(zip(names, picks, strict=True)))
                                  for picks in product(*([p.value(i) for i in range(p.size)] for p in axes))))

    def node_path(self, path: str, line: int) -> str:
        """`path` on the node, relative to the job's directory (`./a//b` is `a/b`)."""
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if path.startswith("/") or ".." in parts or not parts:
            self.fail(line, f"node:{_as_written(path)} is not a file in the job's directory",
                      "name a path relative to it")
        return "/".join(parts)

    def check_task(self, task: _Task) -> None:
        if not task.executes:
            self.fail(task.line, "task main runs no command", "add a line: node:execute COMMAND")
        last = max(task.executes, default=0)
        for name, line in task.outputs.items():
            if line < last:
                self.fail(line, f"node:{_as_written(name)} is copied back before node:execute at line {last}",
                          "move the copy after the last node:execute: gridbot collects outputs when the job ends")
        for program in task.programs:
            index = task.node_files.get(program.removeprefix("./")) if "/" in program else None
            chmod = f"chmod +x {_sh(program.removeprefix('./'))}"
            if index is not None and chmod not in task.steps[index]:
                task.steps[index].append(chmod)

    # -- the words of a line ----------------------------------------------------------------------------

    def template(self, text: str, line: int, where: str) -> str:
        """`text` with `$x`/`${x}` as gridbot's `{x}`, braces doubled, and `$$` as `$`; each name that is not a
        parameter is a problem (`where`: command, input, output, node or home)."""
        def substitute(m: re.Match[str]) -> str:
            word = m.group(0)
            if word == "$$":
                return "$"
            if word == "${":  # not `${name}`: unterminated, or the shell's own syntax
                self.fail(line, f"'${{' without a name and its '}}' in the {where}",
                          "write ${name} for a parameter, or $${ for the shell's own ${...}")
                return ""
            if word in "{}":
                return word * 2
            name = m.group(1) or m.group(2)
            if name in self.axes:
                return f"{{{name}}}"
            if name in self.broken:  # its statement's problem is the cause: no second one for each use of it
                return f"${name}"  # (as written, not a placeholder: the rest of the task reads it as plain text)
            if name in JOB_INDEX and where in ("command", "home"):
                return "${{GRIDBOT_JOB_INDEX}}"
            self.undefined(line, name, where)
            return ""
        return _DOLLAR.sub(substitute, text)

    def undefined(self, line: int, name: str, where: str) -> None:
        if name == "OS":
            self.fail(line, "$OS (the node's operating system) has no value in gridbot: every host gets the same "
                      "input files", "copy one file (calc.linux, not calc.$OS), and keep the bag on the hosts "
                      "that can run it: --policy 'JobRequirements=regexp(\"^Linux\", Host.Platform)'")
        elif name in JOB_INDEX:
            self.fail(line, f"${name} has no value in the name of a file copied to or from the node",
                      "each job's outputs land in its own folder, results/<bag>/<job>/, and every job gets the same "
                      "inputs: drop it (it is known in node:execute lines)")
        else:
            known = [*self.axes, *self.broken]
            hint = closest(name, known) or (f"the parameters are {', '.join(known)}" if known else
                                            "define it with a parameter statement")
            self.fail(line, f"${name} names no parameter", f"{hint}; write $${name} for the shell's ${name}")

    def tokens(self, line: int, text: str) -> list[str] | None:
        """The words of a parameter statement: quoted strings whole, up to its `;` or a comment."""
        out = []
        rest_allowed = True
        for m in _TOKEN.finditer(text):
            word = m.group(0)
            if word.startswith(("#", "//")):
                break
            if not rest_allowed:
                self.fail(line, f"{word!r} after ';'", "end the statement with ';', or put a comment after it (#)")
                return None
            if word == '"':
                self.fail(line, "a quoted string has no closing quote", 'close it: "..."')
                return None
            if word == ";":
                rest_allowed = False
            else:
                out.append(word)
        return out

    def args(self, line: int, text: str) -> list[str] | None:
        words = _ARG.findall(text)
        if '"' in words:
            self.fail(line, "a quoted string has no closing quote", 'close it: "..."')
            return None
        return words

    def unknown(self, line: int, keyword: str, known: tuple[str, ...], usage: str) -> None:
        if keyword in _UNSUPPORTED:
            self.fail(line, f"'{keyword}' is not supported", _UNSUPPORTED[keyword])
        else:
            self.fail(line, f"unknown statement '{keyword[:60]}'", closest(keyword, known) or usage)

    # -- the TOML ---------------------------------------------------------------------------------------

    def toml(self, task: _Task) -> list[tuple[str, int | None]]:
        command = " && ".join(step for steps in task.steps for step in steps)
        out: list[tuple[str, int | None]] = [
            ("# A Nimrod/G plan file, translated by gridbot (docs/spec.md, \"Nimrod plan files\").", None),
            (f"command = {_toml_string(command)}", task.executes[0])]
        for key, names in (("inputs", task.inputs), ("outputs", task.outputs)):
            if names:
                items = ", ".join(map(_toml_string, names))
                out.append((f"{key} = [{items}]", min(names.values())))
        if self.axes:
            out.append(("", None))
            out.append(("[parameters]", min(a.line for a in self.axes.values())))
            for a in self.axes.values():
                label = f", label {_toml_string(a.label)}" if a.label else ""
                out.append((f"{a.name} = {a.value}  # line {a.line}{label}", a.line))
        return out


def _statements(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each statement: blank lines and comments (`#`, `//`) dropped, a line ending
    in `\\` joined to the next."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.split("\n"), 1):  # as editors count: not at \x85 or \u2028
        line = raw.strip()
        if pending is not None:
            number, line = pending[0], f"{pending[1]} {line}".strip()
            pending = None
        elif not line or line.startswith(("#", "//")):
            continue
        if line.endswith("\\"):
            pending = number, line[:-1].rstrip()
            continue
        if line:
            out.append((number, line))
    if pending is not None and pending[1]:
        out.append(pending)
    return out


def _side(arg: str) -> tuple[bool, str]:
    """(on the node?, path) of a copy's argument: `node:PATH`, `root:PATH` or a path of the home machine."""
    for prefix, node in (("node:", True), ("root:", False)):
        if arg.startswith(prefix):
            return node, arg[len(prefix):]
    return False, arg


def _range_axis(name: str, line: int, start: Decimal, stop: Decimal, step: Decimal) -> _Axis:
    value = f"{{ from = {_toml_number(start)}, to = {_toml_number(stop)}, step = {_toml_number(step)} }}"
    return _Axis(name, line, value, Parameter(name, start=str(start), stop=str(stop), step=str(step)))


def _node_dest(dest: str, base: str) -> str:
    """The file `copy ... node:DEST` makes: DEST, or the source's name in DEST when it is a folder."""
    if dest in ("", ".", "./"):
        return base
    return dest + base if dest.endswith("/") else dest


def _cp(source: str, target: str) -> list[str]:
    folder = target.rsplit("/", 1)[0] if "/" in target.removeprefix("./") else ""
    return [*([f"mkdir -p {_sh(folder)}"] if folder else []), f"cp {_sh(source)} {_sh(target)}"]


def _sh(word: str) -> str:
    """`word` quoted for the shell when it must be (gridbot's `{x}` placeholders always are: values vary)."""
    return word if _SHELL_SAFE.fullmatch(word) else shlex.quote(word)


def _as_written(template: str) -> str:
    """A template written back as the plan wrote it, for messages."""
    return re.sub(r"(?<!\{)\{([A-Za-z_][A-Za-z0-9_]*)\}(?!\})", r"${\1}", template)


def _unquote(word: str) -> str:
    """The text of a C-style quoted string (`\\"`, `\\\\`, `\\n`, `\\t`)."""
    body = word[1:-1] if len(word) >= 2 and word.endswith('"') else word[1:]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _number(word: str) -> Decimal | None:
    return Decimal(word) if _NUMBER.fullmatch(word) else None


def _toml_number(d: Decimal) -> str:
    """A number as TOML: an integer or a float when TOML reads it back exactly, else the exact decimal as a
    string (which ranges and values also take)."""
    if d == d.to_integral_value() and abs(d) < 2**63:
        return str(int(d))
    text = format(d.normalize(), "f")
    return text if "." in text and Decimal(repr(float(text))) == Decimal(text) else _toml_string(text)


def _render_literal(literal: str) -> str:
    """The value gridbot renders for one TOML literal written by this module."""
    if literal.startswith('"'):
        value = json.loads(literal)
        assert isinstance(value, str)
        return value
    d = Decimal(literal)
    return str(int(d)) if d == d.to_integral_value() else format(d.normalize(), "f")


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML wants escaped too."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
