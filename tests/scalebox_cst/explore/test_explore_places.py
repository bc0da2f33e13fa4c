"""scalebox explore's tunable places (libcst) and its config: what is found, what is changed
(exactly the literal), look-alikes left alone, and bad input as one line naming the key."""
from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from scalebox_cst.explore import config as cfg
from scalebox_cst.explore.places import PlaceError, find_places, render, resolve, set_values

SOURCE = textwrap.dedent(
    """\
    import argparse
    import os
    from dataclasses import dataclass, field

    import torch

    LR = 3e-4
    CLIP: float = -0.5  # a comment kept
    ENV_ID = "CartPole-v1"
    DEVICE = os.environ.get("DEVICE", "cpu")
    ALIAS = LR
    NOTHING = None


    @dataclass
    class Args:
        learning_rate: float = 2.5e-4
        num_envs: int = 4
        anneal_lr: bool = True
        gamma: float = field(default=0.99)
        workers: int = field(default_factory=lambda: 2)


    class Plain:
        hidden: int = 64


    def main():
        INNER = 5
        parser = argparse.ArgumentParser()
        parser.add_argument("--total-steps", type=int, default=(1000))
        parser.add_argument("-g", "--gamma", type=float, default=0.99)
        parser.add_argument("--threads", type=int, default=os.cpu_count())
        parser.add_argument("--ent", dest="ent_coef", type=float, default=0.01)
        opt = torch.optim.Adam([], lr=3e-4, eps=1e-5, amsgrad=False)
        print("x", end="")
        return INNER
    """
)


def places():
    return find_places("train.py", SOURCE.encode())


def test_finds_each_kind_and_leaves_look_alikes():
    found = {(p.qualified, p.kind): p for p in places()}
    assert set(found) == {
        ("LR", "constant"), ("CLIP", "constant"), ("ENV_ID", "constant"),
        ("Args.learning_rate", "field"), ("Args.num_envs", "field"), ("Args.anneal_lr", "field"), ("Args.gamma", "field"),
        ("--total-steps", "argparse"), ("--gamma", "argparse"), ("--ent", "argparse"),
        ("Adam.lr", "kwarg"), ("Adam.eps", "kwarg"),
    }
    # values and where they are
    assert found[("LR", "constant")].value == 3e-4 and found[("LR", "constant")].line == 7
    assert found[("CLIP", "constant")].value == -0.5
    assert found[("--total-steps", "argparse")].name == "total_steps"
    assert found[("--ent", "argparse")].name == "ent_coef"  # dest= wins
    # not places: a call's value, a name, None, a function-local constant, a non-config class,
    # a default computed at run time, default_factory, a bool keyword of a call, print's end=
    names = {p.name for p in places()}
    for absent in ("DEVICE", "ALIAS", "NOTHING", "INNER", "hidden", "threads", "workers", "Adam.amsgrad", "print.end"):
        assert absent not in names


def test_set_values_changes_exactly_the_literals():
    ps = places()
    edits = [(resolve("LR", ps), 1.2e-3), (resolve("CLIP", ps), -2.0), (resolve("--total-steps", ps), 50),
             (resolve("Args.gamma", ps), 0.95), (resolve("Adam.eps", ps), 1e-8), (resolve("ENV_ID", ps), "Acrobot-v1")]
    out = set_values(SOURCE.encode(), edits).decode()
    before, after = SOURCE.splitlines(), out.splitlines()
    assert len(before) == len(after)  # line numbers of every other site stay valid
    changed = {i + 1: (a, b) for i, (a, b) in enumerate(zip(before, after)) if a != b}
    assert set(changed) == {p.line for p, _ in edits}
    tree = cst.parse_module(out)
    # the rewritten literals read back as the values (structure, not text)
    for place, value in edits:
        again = [p for p in find_places("train.py", out.encode()) if p.qualified == place.qualified and p.kind == place.kind]
        assert again[0].value == value
    assert "# a comment kept" in out and "(50)" in out  # formatting around a literal kept
    assert tree.code == out


CONFIGS = textwrap.dedent(
    """\
    import argparse
    import json


    class Agent:
        def __init__(self, n, gamma=0.9):
            self.gamma = 0.99
            self.eps = 1e-8
            self.n = n
            self.name = "ppo"
            self.cfg = {"tau": 0.005, "net": {"hidden": 64}}

            def later():
                self.inner = 5

        def act(self):
            self.steps = 0


    def main():
        hp = {"batch_size": 64, 3: 1, "two words": 2, "ent-coef": 0.1, "lst": [1, 2], "off": None}
        hp2: dict = {"clip": 0.2}
        json.dumps({"not_bound": 1})
        squares = {f"k{i}": i for i in range(3)}
        parser = argparse.ArgumentParser()
        parser.add_argument("--gamma", type=float, default=0.98)
    """
)


def test_dict_keys_and_init_attributes_are_places_by_their_qualified_names():
    """Hyper-parameters kept in a dict (``hp = {...}`` in ``main()``) or set in an agent's
    ``__init__`` (``self.gamma = 0.99``) were not places: explore could not tune them."""
    found = {(p.qualified, p.kind): p for p in find_places("agent.py", CONFIGS.encode())}
    assert set(found) == {
        ("Agent.gamma", "attribute"), ("Agent.eps", "attribute"), ("Agent.name", "attribute"),
        ("Agent.cfg.tau", "key"), ("Agent.cfg.net.hidden", "key"),
        ("hp.batch_size", "key"), ("hp2.clip", "key"), ("--gamma", "argparse"),
    }
    # not places: a parameter's value, an attribute set outside __init__ or in a function nested in
    # it, keys that are not identifiers, a list, None, a dict not bound by an assignment, a comprehension
    assert found[("Agent.cfg.net.hidden", "key")].value == 64
    ps = list(found.values())
    assert resolve("gamma", ps).kind == "argparse"  # the short name stays the flag's
    edits = [(resolve("Agent.gamma", ps), 0.95), (resolve("hp.batch_size", ps), 128), (resolve("Agent.cfg.net.hidden", ps), 32),
             (resolve("Agent.name", ps), "sac")]
    out = set_values(CONFIGS.encode(), edits).decode()
    assert len(out.splitlines()) == len(CONFIGS.splitlines())
    again = {p.qualified: p.value for p in find_places("agent.py", out.encode())}
    assert (again["Agent.gamma"], again["hp.batch_size"], again["Agent.cfg.net.hidden"], again["Agent.name"]) == (0.95, 128, 32, "sac")
    assert again["Agent.cfg.tau"] == 0.005 and again["hp2.clip"] == 0.2


def test_render_keeps_floats_floats():
    assert render(1.0) == "1.0" and render(1e-5) == "1e-05" and render(3) == "3" and render(True) == "True"
    assert isinstance(eval(render(2.0)), float)
    for value in (float("nan"), float("inf"), float("-inf")):  # repr would write a name: nan, inf
        with pytest.raises(PlaceError, match="not a finite number"):
            render(value)


def test_a_tuned_value_no_literal_writes_is_one_line_naming_it():
    # optimal_params.json edited by hand (json reads NaN): `LR = nan` was committed as the tuned source
    from scalebox_cst.explore.command import _assignments

    place = {"path": "train.py", "qualified": "LR", "kind": "constant", "line": 10, "name": "LR"}
    for value in (float("nan"), [1, 2]):
        with pytest.raises(PlaceError) as exc:
            _assignments({"params": {"LR": value}, "places": {"LR": place}}, {"train.py": SOURCE.encode()}, "optimal_params.json")
        assert str(exc.value).startswith("optimal_params.json: params.LR: cannot write") and "\n" not in str(exc.value)


def test_resolve_unknown_and_ambiguous_are_one_line():
    ps = places()
    with pytest.raises(PlaceError) as exc:
        resolve("lr", ps)
    assert "unknown parameter 'lr'" in str(exc.value) and "Adam.lr" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(PlaceError) as exc:
        resolve("gamma", ps)  # the config field and the argparse option
    assert "ambiguous" in str(exc.value) and "train.py:20:gamma" in str(exc.value) and "train.py:32:gamma" in str(exc.value)
    assert resolve("train.py:32:gamma", ps).kind == "argparse"
    assert resolve("--gamma", ps).kind == "argparse"


def test_a_place_that_moved_is_an_error_naming_it():
    ps = places()
    lr = resolve("LR", ps)
    moved = SOURCE.replace("LR = 3e-4", "LR = compute()")
    with pytest.raises(PlaceError, match="train.py:7:LR"):
        set_values(moved.encode(), [(lr, 1.0)])


def write(tmp_path, text, name="explore.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


GOOD = textwrap.dedent("""\
    script: train.py
    metric: episodic_return
    params:
      LR: {loguniform: [1.0e-4, 1.0e-2]}
      Args.num_envs: {int: [1, 8], log: true}
      Args.anneal_lr: {choice: [true, false]}
    """)


def test_config_reads_yaml_and_toml(tmp_path):
    c = cfg.load(write(tmp_path, GOOD))
    assert c.study == "explore" and c.sampler == "tpe" and c.trials == 20 and c.seeds == [None]
    bound = cfg.bind(c, places())
    assert bound["LR"].line == 7 and bound["Args.num_envs"].kind == "field"
    t = cfg.load(write(tmp_path, """\
        script = "train.py"
        metric = "score"
        trials = 3
        seeds = [0, 1]
        [params]
        LR = {uniform = [0.0, 1.0]}
        """, "s.toml"))
    assert t.study == "s" and t.seeds == [0, 1] and t.params[0].kind == "uniform"


def test_yaml_reads_an_exponent_without_a_dot_as_a_number(tmp_path):
    """PyYAML (YAML 1.1) reads ``1e-4`` as a string: ``loguniform: [1e-4, 1e-2]``, as most people
    write a learning rate, was refused with "got ['1e-4', '1e-2']"."""
    c = cfg.load(write(tmp_path, GOOD.replace("loguniform: [1.0e-4, 1.0e-2]", "loguniform: [1e-4, 1E+1]")))
    spec = next(p for p in c.params if p.key == "LR")
    assert (spec.low, spec.high) == (1e-4, 10.0) and isinstance(spec.low, float)
    raw = cfg._unique_keys_loader()
    import yaml
    assert yaml.load("[1e-4, '1e-4', 1e4x, 12, 2_5e3]", Loader=raw) == [1e-4, "1e-4", "1e4x", 12, 25000.0]


@pytest.mark.parametrize("text, message", [
    (GOOD + "trails: 5\n", "explore.yaml: trails: unknown key"),
    (GOOD.replace("loguniform: [1.0e-4, 1.0e-2]", "loguniform: [0, 1]"), "params.LR.loguniform: expects 0 < low < high"),
    (GOOD.replace("loguniform: [1.0e-4, 1.0e-2]", "loguniform: [a, 1]"), "params.LR.loguniform: expects [low, high] numbers"),
    (GOOD.replace("int: [1, 8]", "int: [1.5, 8]"), "params.Args.num_envs.int: expects [low, high] integers"),
    (GOOD.replace("metric: episodic_return\n", ""), "explore.yaml: metric: missing"),
    (GOOD + "direction: up\n", "direction: expects maximize or minimize"),
    (GOOD + "parallel: 0\n", "parallel: expects an integer >= 1"),
    ("script: [", "explore.yaml:1: not valid YAML"),
    # numpy refused these in every trial's child ("Seed must be between 0 and 2**32 - 1")
    (GOOD + "seeds: [-1]\n", "seeds: expects a non-empty list of integers from 0 to 4294967295, got [-1]"),
    (GOOD + "seeds: [4294967296]\n", "seeds: expects a non-empty list of integers from 0 to 4294967295"),
    # a RecursionError traceback from the YAML parser
    (GOOD + "files: " + "[" * 10000 + "]" * 10000 + "\n", "explore.yaml: values nested too deeply to read"),
    # numpy's OverflowError ("Range exceeds valid bounds") in a worker thread, the study ending 0
    (GOOD.replace("loguniform: [1.0e-4, 1.0e-2]", "uniform: [0, .inf]"), "params.LR.uniform: expects finite low and high"),
    (GOOD.replace("loguniform: [1.0e-4, 1.0e-2]", "uniform: [-1.0e+308, 1.0e+308]"), "params.LR.uniform: expects finite low and high"),
    (GOOD.replace("loguniform: [1.0e-4, 1.0e-2]", "loguniform: [1.0e-4, .inf]"), "params.LR.loguniform: expects finite low and high"),
    # written into the trial's code as `LR = nan` / `inf`: a NameError in every trial that drew it
    (GOOD.replace("loguniform: [1.0e-4, 1.0e-2]", "choice: [1.0e-3, .nan]"), "params.LR.choice: expects finite numbers"),
    (GOOD.replace("loguniform: [1.0e-4, 1.0e-2]", "choice: [-.inf, 1.0e-3]"), "params.LR.choice: expects finite numbers"),
    # Popen's "ValueError: embedded null byte" traceback in every trial
    (GOOD + 'args: ["--x", "a\\0b"]\n', "args: expects a list of strings (without NUL bytes"),
    (GOOD.replace("script: train.py", 'script: "tr\\0ain.py"'), "script: expects a path without NUL bytes"),
    # `$` matches before a last newline: a study folder named "k\n" was made, its lines broken in two
    (GOOD + 'study: "k\\n"\n', "study: expects a name of letters, digits"),
    # a key given twice kept the last in silence (TOML refuses it itself); `<<:` merges may be overridden
    (GOOD + "trials: 5\ntrials: 6\n", "not valid YAML (key 'trials' given twice)"),
])
def test_config_errors_name_the_key(tmp_path, text, message):
    with pytest.raises(cfg.ExploreConfigError) as exc:
        cfg.load(write(tmp_path, text))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_merged_mapping_may_override_its_keys(tmp_path):
    """A key given twice is refused (above); one that overrides a ``<<:`` merge is not."""
    c = cfg.load(write(tmp_path, "script: train.py\nmetric: m\nparams:\n  LR: {<<: {uniform: [0.0, 1.0]}, uniform: [0.1, 0.2]}\n"))
    assert (c.params[0].low, c.params[0].high) == (0.1, 0.2)


@pytest.mark.parametrize("param, message", [
    ("lr: {uniform: [0.1, 0.2]}", "params.lr: unknown parameter 'lr' in train.py (tunable places: "),
    ("Args.num_envs: {uniform: [1, 8]}", "uniform gives floats but Args.num_envs (train.py:18) is an int (4); use int: [low, high]"),
    ("ENV_ID: {uniform: [1, 8]}", "uniform gives numbers but ENV_ID (train.py:9) holds 'CartPole-v1'"),
    ("gamma: {uniform: [0.9, 0.99]}", "params.gamma: 'gamma' is ambiguous"),
])
def test_binding_errors(tmp_path, param, message):
    c = cfg.load(write(tmp_path, f"script: train.py\nmetric: m\nparams:\n  {param}\n"))
    with pytest.raises(cfg.ExploreConfigError) as exc:
        cfg.bind(c, places())
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_an_unknown_parameter_names_the_files_looked_at_and_files_key(tmp_path):
    """Found by a newcomer (ericyangyu's PPO-for-Beginners: main.py calls ppo.py): `explore --list
    ppo.py` showed `full.fill_value`, and a study of main.py naming it said "unknown parameter
    'full.fill_value'; tunable places: (none)", as if ppo.py had none: only the script's places
    and those of `files:` are looked at, and the message said neither."""
    c = cfg.load(write(tmp_path, "script: main.py\nmetric: m\nparams:\n  full.fill_value: {uniform: [0.1, 1.0]}\n"))
    with pytest.raises(cfg.ExploreConfigError) as exc:
        cfg.bind(c, find_places("main.py", b"import ppo\n"))
    assert str(exc.value).endswith("params.full.fill_value: unknown parameter 'full.fill_value' in main.py (tunable places: "
                                   "(none)); a place of another file: list it under files:")


def test_set_values_with_tabs_non_ascii_and_odd_line_ends():
    source = 'NAME = "h\u00e9\u2028llo"\r\nif True:\n\tX = {"\u00e9": 1}; LR = 0.5  # \x0c\r\nGAMMA = (0.9)\n'.encode()
    ps = find_places("t.py", source)
    assert [p.name for p in ps] == ["NAME", "X.\u00e9", "LR", "GAMMA"]  # module level under an if; X is no literal, its key is
    out = set_values(source, [(resolve("GAMMA", ps), 0.95), (resolve("NAME", ps), "x"), (resolve("LR", ps), 0.25),
                              (resolve("X.\u00e9", ps), 2)]).decode()
    assert out == 'NAME = \'x\'\r\nif True:\n\tX = {"\u00e9": 2}; LR = 0.25  # \x0c\r\nGAMMA = (0.95)\n'
    module = "\n".join(["import torch", "", "opt = torch.optim.Adam(p, lr=3e-4)  # \u00e9", ""])
    ps = find_places("m.py", module.encode())
    assert set_values(module.encode(), [(resolve("Adam.lr", ps), 1e-3)]).decode() == module.replace("3e-4", "0.001")


def test_the_monitor_refuses_a_study_name_ending_in_a_newline(tmp_path):
    from scalebox_cst.explore import monitor_api
    from scalebox_cst.monitor.api import ApiError

    folder = tmp_path / ".scalebox" / "explore" / "k\n"
    folder.mkdir(parents=True)
    (folder / "journal.log").write_text("")
    assert monitor_api.studies(str(tmp_path)) == {"studies": []}
    with pytest.raises(ApiError, match="bad study name"):
        monitor_api.study(str(tmp_path), "k\n")


def test_the_report_is_never_written_through_a_link_nor_left_half_written(tmp_path):
    import os

    from scalebox_cst import tmpnames
    from scalebox_cst.explore import report

    outside = tmp_path / "outside.txt"
    outside.write_text("theirs")
    folder = tmp_path / ".scalebox" / "explore" / "s"
    folder.mkdir(parents=True)
    path = str(folder / "report.html")
    for name in (f"{path}.{os.getpid()}.tmp", tmpnames.sibling(path, tmpnames.writer_id(thread=True))):
        os.symlink(outside, name)  # the temporary's name, planted (a project ships its .scalebox/)
    report._atomic(path, "REPORT")
    assert outside.read_text() == "theirs" and open(path).read() == "REPORT"
    with pytest.raises(UnicodeEncodeError):
        report._atomic(path, "half \udc80")  # fails mid-write, as a full disk does
    assert open(path).read() == "REPORT"
    assert [n for n in os.listdir(folder) if n != "report.html" and not (folder / n).is_symlink()] == []  # no half file
