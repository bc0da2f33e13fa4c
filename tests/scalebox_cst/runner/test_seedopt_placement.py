"""Where ``--seeds`` places the seed option: each script is run with the arguments seedopt gives
it, and must read the seed it was given."""
import subprocess
import sys
import textwrap

import pytest

from scalebox_cst.runner import seedopt

BOTH = """\
import argparse
p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, default=None)
sub = p.add_subparsers(dest="cmd")
t = sub.add_parser("train")
t.add_argument("--seed", type=int, default=None)
t.add_argument("--lr")
print("seed", p.parse_args().seed)
"""

CLICK_GROUP = """\
import click
@click.group()
@click.option("--seed", type=int, default=None)
@click.pass_context
def cli(ctx, seed):
    ctx.obj = seed
@cli.command()
@click.option("--lr")
@click.pass_context
def train(ctx, lr):
    print("seed", ctx.obj)
cli()
"""

CLICK_COMMAND = """\
import click
@click.group()
def cli():
    pass
@cli.command()
@click.option("--seed", type=int, default=None)
@click.option("--lr")
def train(seed, lr):
    print("seed", seed)
cli()
"""

TOP_ONLY = """\
import argparse
def parser():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=None)
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("train").add_argument("--lr")
    return p
print("seed", parser().parse_args().seed)
"""


@pytest.mark.parametrize("name,script", [("both", BOTH), ("click_group", CLICK_GROUP), ("click_command", CLICK_COMMAND),
                                         ("top_only", TOP_ONLY)])
def test_the_script_reads_the_seed_it_is_given(tmp_path, name, script):
    """A --seed on the top parser and on the subcommand's: put first, argparse copied the
    subcommand's default (None) over it and every seed ran unseeded, silently. A --seed of a
    click group: appended, click refused it ("No such option") and every seeded run failed."""
    if "click" in script:
        pytest.importorskip("click")
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(script))
    args, via = seedopt.seeded(path.read_bytes(), ["train", "--lr", "1"], 3)
    assert via == "option"
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "seed 3", (args, proc.stdout, proc.stderr)
    assert seedopt.without_seed(args, 3) == ["train", "--lr", "1"]


#: --seed on a parent parser the main parser, with subcommands, inherits: it goes first (appended,
#: argparse refused it after the subcommand: "unrecognized arguments", every seeded run failed)
PARENTS = """\
import argparse
common = argparse.ArgumentParser(add_help=False)
common.add_argument("--seed", type=int, default=None)
p = argparse.ArgumentParser(parents=[common])
sub = p.add_subparsers(dest="cmd")
sub.add_parser("train").add_argument("--lr")
print("seed", p.parse_args().seed)
"""

#: through a parent of a parent
GRANDPARENTS = """\
import argparse
base = argparse.ArgumentParser(add_help=False)
base.add_argument("--seed", type=int, default=None)
common = argparse.ArgumentParser(add_help=False, parents=[base])
p = argparse.ArgumentParser(parents=(common,))
sub = p.add_subparsers(dest="cmd")
sub.add_parser("train").add_argument("--lr")
print("seed", p.parse_args().seed)
"""

#: look-alike: the subcommand's parser inherits it too, so it goes after (first, argparse copied
#: the subcommand's default over the value given)
PARENTS_BOTH = """\
import argparse
common = argparse.ArgumentParser(add_help=False)
common.add_argument("--seed", type=int, default=None)
p = argparse.ArgumentParser(parents=[common])
sub = p.add_subparsers(dest="cmd")
t = sub.add_parser("train", parents=[common])
t.add_argument("--lr")
print("seed", p.parse_args().seed)
"""

#: look-alike: only the subcommand's parser inherits it: after the subcommand
PARENTS_SUBCOMMAND = """\
import argparse
common = argparse.ArgumentParser(add_help=False)
common.add_argument("--seed", type=int, default=None)
p = argparse.ArgumentParser()
sub = p.add_subparsers(dest="cmd")
sub.add_parser("train", parents=[common]).add_argument("--lr")
print("seed", p.parse_args().seed)
"""

#: look-alike: a parents= of a call that makes no parser inherits nothing; the top parser with
#: subcommands declares --seed itself: first
PARENTS_WORD = """\
import argparse
def describe(parents):
    return len(parents)
p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, default=None)
sub = p.add_subparsers(dest="cmd")
sub.add_parser("train").add_argument("--lr")
describe(parents=[p])
print("seed", p.parse_args().seed)
"""


@pytest.mark.parametrize("name,script,first", [
    ("parents", PARENTS, True), ("grandparents", GRANDPARENTS, True), ("parents_both", PARENTS_BOTH, False),
    ("parents_subcommand", PARENTS_SUBCOMMAND, False), ("parents_word", PARENTS_WORD, True)])
def test_a_seed_inherited_through_argparse_parents_is_placed_where_the_script_reads_it(tmp_path, name, script, first):
    """A --seed the script's parsers get through ``parents=[common]`` is the script's own option,
    placed where argparse takes it: ahead of the subcommand where only the top parser (with
    subcommands) inherits it, after where the subcommand's parser has it too."""
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    args, via = seedopt.seeded(path.read_bytes(), ["train", "--lr", "1"], 3)
    assert via == "option" and args.count("--seed") == 1
    assert args == (["--seed", "3", "train", "--lr", "1"] if first else ["train", "--lr", "1", "--seed", "3"])
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "seed 3", (args, proc.stdout, proc.stderr)
    assert seedopt.without_seed(args, 3) == ["train", "--lr", "1"]


def test_scalebox_run_seeds_a_script_whose_seed_comes_from_a_parent_parser(tmp_path):
    """The same through ``scalebox run --seeds``: every seeded run read its seed and ended ok."""
    from conftest import scalebox

    (tmp_path / "train.py").write_text(PARENTS)
    scalebox("init", ".", cwd=tmp_path)
    proc = scalebox("run", "--seeds", "3,4", "train.py", "train", "--lr", "1", cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert "seed 3" in proc.stdout and "seed 4" in proc.stdout, proc.stdout
