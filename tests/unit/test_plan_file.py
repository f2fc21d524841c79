"""Nimrod/G plan files (issue 16): the paper's Figure 9 and the rest of the language, translated into the bag
a TOML spec makes, and the errors, with the plan's line numbers, for what gridbot cannot honour."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridbot.model.plan_file import parse_plan, plan_to_toml
from gridbot.model.spec import SpecError, parse_spec

FIGURE_9 = """\
#Parameter definition
parameter length integer range from 1 to 200 step 1;
parameter time_base_value integer default 10;
#Task definition
task main
#Copy necessary executables depending on node type
copy calc.$OS node:calc
#Execute program with parameter values on remote node
node:execute ./calc $length $time_base_value
#Copy results file to use home node with jobname as extension
copy node:output ./output.$jobname
endtask
"""
"""Figure 9 of Buyya et al., SPE 2005 (the seed's text has OCR slips: `time_base_alue`, `clac.SOS`)."""


def plan(text, **kw):
    return parse_plan(text, "sweep.pln", "sweep", **kw)


def problems(text, **kw):
    with pytest.raises(SpecError) as info:
        plan(text, **kw)
    return [(p.line, p.message, p.hint) for p in info.value.problems]


def task(*lines):
    return "task main\n" + "".join(f"  {line}\n" for line in lines) + "endtask\n"


def test_figure_9_with_one_binary_is_200_jobs_of_calc():
    spec = plan(FIGURE_9.replace("calc.$OS", "calc.linux"))
    assert spec.sweep_size == 200 and spec.name == "sweep"
    assert spec.inputs == ["calc.linux"] and spec.outputs == ["output"]
    assert spec.params(0) == {"length": "1", "time_base_value": "10"}
    assert spec.render(0)[0] == "cp calc.linux calc && chmod +x calc && ./calc 1 10"
    assert spec.render(199)[0] == "cp calc.linux calc && chmod +x calc && ./calc 200 10"


def test_figure_9_as_printed_names_the_line_of_os_and_the_fix():
    [(line, message, hint)] = problems(FIGURE_9)
    assert line == 7 and "$OS" in message and "every host gets the same input files" in message
    assert "calc.linux, not calc.$OS" in hint and "JobRequirements" in hint


def test_the_toml_translation_makes_the_same_bag():
    text = FIGURE_9.replace("calc.$OS", "calc")
    toml = plan_to_toml(text, "sweep.pln")
    assert 'command = "chmod +x calc && ./calc {length} {time_base_value}"' in toml
    assert 'length = { from = 1, to = 200, step = 1 }' in toml
    assert parse_spec(toml, "sweep.toml", "sweep") == plan(text)


def test_defaults_of_each_type_are_one_value():
    spec = plan('parameter n integer default 10;\nparameter x float default 2.50\n'
                'parameter who label "Who" text default "a b";  # a comment\n' + task("node:execute echo $n $x $who"))
    assert spec.sweep_size == 1 and spec.render(0)[0] == "echo 10 2.5 a b"


def test_select_anyof_sweeps_every_value_and_oneof_picks_one():
    spec = plan('parameter mode text select anyof "fast" "exact" plain;\n'
                'parameter k integer select anyof 1 2 3\n'
                'parameter o text select oneof "x" "y" default "y"\n'
                'parameter first float select oneof 0.5 0.25\n' + task("node:execute run ${mode} $k $o $first"))
    assert spec.sweep_size == 9
    assert [spec.render(i)[0] for i in (0, 1, 3, 8)] == [
        "run fast 1 y 0.5", "run fast 2 y 0.5", "run exact 1 y 0.5", "run plain 3 y 0.5"]


def test_float_ranges_are_exact_decimals_and_points_spread_evenly():
    spec = plan("parameter a float range from 0.1 to 0.5 step 0.1\n"
                "parameter b float range from 0 to 1 points 3\n"
                "parameter c float range from 0 to 1 points 4\n" + task("node:execute run $a $b $c"))
    assert spec.sweep_size == 5 * 3 * 4
    assert [spec.params(i)["a"] for i in range(0, 60, 12)] == ["0.1", "0.2", "0.3", "0.4", "0.5"]
    assert [spec.params(i)["b"] for i in range(0, 12, 4)] == ["0", "0.5", "1"]
    assert [spec.params(i)["c"] for i in range(4)] == ["0", "0.333333333333333", "0.666666666666667", "1"]


def test_several_executes_are_joined_in_order_and_copies_keep_their_place():
    spec = plan("parameter x integer range from 1 to 2\n" + task(
        "copy model.tar node:.", "node:execute tar xf model.tar", "copy bin/sim node:tools/sim",
        "node:execute ./tools/sim --x=$x > out.$x", "copy node:out.$x results/out.$x"))
    assert spec.inputs == ["model.tar", "bin/sim"] and spec.outputs == ["out.{x}"]
    assert spec.render(1)[0] == ("tar xf model.tar && mkdir -p tools && cp sim tools/sim && chmod +x tools/sim && "
                                 "./tools/sim --x=2 > out.2")


def test_dollar_braces_job_name_and_continued_lines():
    spec = plan("parameter x integer default 3\n" + task(
        "node:execute awk '{print $$1, $x}' in.txt \\", "   > out.$jobname.${x}", "shexec \"echo \\\"$x\\\"\""))
    command = spec.render(0)[0]
    assert command == "awk '{print $1, 3}' in.txt > out.${GRIDBOT_JOB_INDEX}.3 && echo \"3\""


def test_copying_a_parameter_named_file_stages_every_value():
    spec = plan('parameter model text select anyof "a.dat" "b.dat"\n' + task(
        "copy data/$model node:.", "copy data/$model node:input.dat", "node:execute sim input.dat"))
    assert spec.inputs == ["data/a.dat", "data/b.dat"]
    assert spec.render(1)[0] == "cp 'b.dat' input.dat && sim input.dat"  # a value may hold spaces


def test_unknown_statements_name_their_line_and_the_likely_word():
    found = problems("paramter x integer default 1\n" + task("node:exec ./a", "node:execute ./a"))
    assert found == [(1, "unknown statement 'paramter'", "did you mean 'parameter'?"),
                     (3, "unknown statement 'node:exec'", "did you mean 'node:execute'?")]


def test_what_gridbot_cannot_honour_is_an_error_not_skipped():
    found = problems("parameter r float random from 0 to 1\n"
                     "parameter f files select anyof \"*.dat\"\n"
                     "task nodestart\n  copy setup node:setup\nendtask\n" +
                     task("execute ./prepare", "onerror ignore", "redirect stdout to log", "node:execute ./a"))
    assert [(line, message) for line, message, _ in found] == [
        (1, "parameter 'r': 'random' is not supported"), (2, "parameter 'f': type 'files' is not supported"),
        (3, "task 'nodestart' is not supported"), (7, "'execute' is not supported"),
        (8, "onerror ignore is not supported"), (9, "'redirect' is not supported")]
    assert all(hint for _, _, hint in found)


def test_bad_ranges_name_their_line():
    found = problems("parameter a integer range from 10 to 1 step 1;\n"
                     "parameter b integer range from 1 to 10 step 0.5;\n"
                     "parameter c float range from x to 3;\n"
                     "parameter d float range 1 to 3;\n" + task("node:execute ./run"))
    assert [(line, message) for line, message, _ in found] == [
        (1, "range 'a' from 10 to 1 step 1 is empty"),
        (2, "parameter 'b' is integer: 'step' 0.5 is not a whole number"),
        (3, "parameter 'c': 'from' must be a number, not 'x'"),
        (4, "parameter 'd': a range is 'range from A to B step S'")]
    assert found[0][2] == "swap 'from' and 'to', or change the sign of 'step'"


@pytest.mark.parametrize(("statement", "message"), [
    ("parameter x integer range from 1 to 10 stepp 1;", "parameter 'x': a range is 'range from A to B step S'"),
    ("parameter x integer default 1.5", "parameter 'x' is integer: '1.5' is not a whole number"),
    ("parameter x intger default 1", "parameter 'x': unknown type 'intger'"),
    ('parameter x text select anyof "a b;', "a quoted string has no closing quote"),
    ('parameter x label "L integer default 1', "a quoted string has no closing quote")])
def test_one_bad_parameter_is_one_problem_not_one_more_at_each_use(statement, message):
    """Found by the bad-input hunt: a parameter whose statement failed was then unknown, and every `$x` of the
    task was a problem of its own ('$x names no parameter', five of them here), burying the cause."""
    found = problems(f"{statement}\nparameter y integer default 1\n" + task(
        "copy model.$x node:model", "node:execute ./model $x ${x} $y > out.$x", "copy node:out.$x out"))
    assert [(line, text) for line, text, _ in found] == [(1, message)], found
    [(line, text, _)] = problems(f"{statement}\n" + task("node:execute ./a $xx"))[1:]
    assert (line, text) == (3, "$xx names no parameter"), "a name no statement defines is still one"


def test_a_task_without_endtask_is_named_by_its_first_line():
    assert problems("parameter x integer default 1\n\ntask main\n  node:execute ./a $x\n") == [
        (3, "the task has no 'endtask'", "end it with a line 'endtask'")]
    assert problems("parameter x integer default 1\n") == [
        (None, "the plan file has no 'task main'", "add: task main, a line node:execute COMMAND, and endtask")]


def test_an_undefined_variable_names_its_line_and_the_parameter_meant():
    [(line, message, hint)] = problems("parameter length integer default 1\n" + task("node:execute ./a $lenght"))
    assert (line, message) == (3, "$lenght names no parameter")
    assert hint.startswith("did you mean 'length'?") and "$$lenght" in hint


def test_outputs_copied_back_before_a_later_command_or_with_the_job_name_are_refused():
    found = problems(task("node:execute ./a", "copy node:log log", "node:execute ./b",
                          "copy node:out.$jobname out"))
    assert [line for line, _, _ in found] == [3, 5]
    assert "copied back before node:execute at line 4" in found[0][1]
    assert "has no value in the name of a file" in found[1][1] and "results/<bag>/<job>/" in found[1][2]


def test_problems_parse_spec_finds_point_at_the_plan_lines():
    found = problems("# a sweep\nparameter a integer range from 1 to 100\nparameter b integer range from 1 to 100\n"
                     + task("node:execute ./run $a $b"), max_jobs=1000)
    assert found[0][0] == 2 and "the sweep has 10,000 jobs, over the limit of 1,000" in found[0][1]
    assert problems(task("copy a/x node:x", "copy b/x node:y", "node:execute ./x"))[0][:2] == (
        3, "b/x and a/x (line 2) would both be staged as x")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([
    "parameter x integer range from 1 to 3", "parameter y text select anyof \"a\" b", "parameter z float default",
    "parameter", "task main", "endtask", "node:execute ./a $x ${y} {z}", "copy a node:b", "copy node:$x o",
    "copy \"q", "task", "shexec", "onerror fail", "#c", "", "\\", "parameter x float range from 1e999 to 2 points 3",
    "range from", "parameter w integer range from 0 to 1 points 2.5"]), max_size=8))
def test_any_text_is_a_bag_or_a_spec_error(lines):
    try:
        spec = plan("\n".join(lines))
    except SpecError as e:
        assert e.problems and all(p.message for p in e.problems)
    else:
        assert spec.command and spec.sweep_size >= 1


def test_an_unterminated_brace_placeholder_is_refused_and_the_shells_own_is_written_with_two_dollars():
    """Found by the command-line review of 2026-11-27: `./calc $x ${x` became the command `./calc 1 ${x`, which
    every job's shell then refused."""
    text = "parameter x integer range from 1 to 2;\n" + task("node:execute ./calc $x ${x")
    [(line, message, hint)] = problems(text)
    assert line == 3 and "'${' without a name" in message and "$${" in hint
    spec = plan("parameter x integer range from 1 to 2;\n" + task("node:execute echo $${HOME:-none} $x"))
    assert spec.command == "echo ${{HOME:-none}} {x}"
