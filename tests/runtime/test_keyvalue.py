"""The key=value grammar of output lines (runtime.keyvalue): lines with a label or a counter in
front are read, look-alikes (argv echoes, URLs, reprs, non-numbers) are not."""
import math

import pytest

from scalebox_cst.runtime import keyvalue
from scalebox_cst.runner.execution import STEP_KEYS, parse_metric_line


@pytest.mark.parametrize("line, expected", [
    ("step=200 reward=-1455.4", {"step": 200.0, "reward": -1455.4}),
    # a label or a counter in front (issue 20: these were ignored)
    ("ppo step=200 reward=-1455.4", {"step": 200.0, "reward": -1455.4}),
    ("   0 reward=22.77 len=200", {"step": 0.0, "reward": 22.77, "len": 200.0}),
    ("[train] global_step=64 loss=0.25, entropy=1e-3;", {"global_step": 64.0, "loss": 0.25, "entropy": 1e-3}),
    ("it 7: frame=30 return=.5 mode=train", {"frame": 30.0, "return": 0.5}),  # mode=train: a label
    ("12 step=3 loss=1", {"step": 3.0, "loss": 1.0}),  # step= wins over the leading integer
    ("2026-01-01 12:00:00 INFO loss=2", {"loss": 2.0}),  # a date is no integer: no x
    ("charts/SPS=1200 losses/value_loss=3", {"charts/SPS": 1200.0, "losses/value_loss": 3.0}),
])
def test_numeric_tokens_of_any_line_are_read_with_their_x(line, expected):
    assert parse_metric_line(line) == expected


def test_non_finite_values_are_kept():
    out = parse_metric_line("loss=nan grad=-inf other=Inf")
    assert math.isnan(out["loss"]) and out["grad"] == -math.inf and out["other"] == math.inf


@pytest.mark.parametrize("line", [
    "step=5",  # an x alone is no metric
    "python train.py --lr=3e-4 --seed=1",  # argv echo
    "args: --lr=3e-4 seed=1",  # an option anywhere marks a command line
    "-n=3 batch=4",
    "GET http://host:6006/?run=1&step=2 status=200",  # a URL on the line
    "fetch https://x.org/a?b=1",
    "Namespace(lr=0.0003, seed=1, total_timesteps=4096)",  # argparse repr
    "config {'lr': 0.001, 'gamma': 0.99}",  # dict repr
    "dict(a=1, b=2)",
    "lr=3e-4)",
    "n=1_000 h=0x1f flag=True",  # float() would take 1_000; not a literal of this grammar
    "a==1 b=",
    "plain text without tokens",
    "",
])
def test_look_alikes_give_nothing(line):
    assert parse_metric_line(line) == {}


def test_frame_is_an_x_and_very_long_lines_are_not_read():
    assert "frame" in STEP_KEYS and STEP_KEYS[0] == "global_step"
    assert parse_metric_line("x=1 " * (keyvalue.MAX_LINE // 4 + 1)) == {}
