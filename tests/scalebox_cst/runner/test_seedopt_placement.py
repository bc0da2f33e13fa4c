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
