"""One option schema (scalebox_cst/options.py): every reader of a default takes it from there, and
option_error is the one check (the config loader, the grad_clip transform and the hot-fix policy
each had their own, and the guard's ``z = 10.0`` was written in three places)."""
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from scalebox_cst import config, hotfix, options
from scalebox_cst.config import Config
from scalebox_cst.runtime import stabilizer
from scalebox_cst.transforms import grad_clip
import harness


def test_the_template_writes_the_schema_defaults():
    written = tomllib.loads(config.DEFAULT_TOML)
    for section in ("grad_clip",):
        assert written[section] == options.defaults(section)
    assert written["hotfix"]["max_per_source"] == options.default("hotfix", "max_per_source")


def test_runtime_transform_and_policy_defaults_are_the_schema():
    assert (stabilizer.Z, stabilizer.RATIO, stabilizer.WARMUP) == tuple(
        options.default("grad_clip", k) for k in ("z", "ratio", "warmup"))
    assert grad_clip.GUARD_DEFAULTS == {k: options.default("grad_clip", k) for k in ("z", "ratio", "warmup")}
    assert hotfix.DEFAULTS == options.defaults("hotfix")


@pytest.mark.parametrize("section, key, value", [
    ("grad_clip", "z", -1), ("grad_clip", "warmup", 2.5), ("grad_clip", "mode", "adaptive"),
    ("grad_clip", "skip_nonfinite", "yes"), ("hotfix", "window", "x"), ("hotfix", "max_per_sauce", 1),
])
def test_one_check_one_message(section, key, value):
    """The loader, the transform and the policy say the same line for the same bad value."""
    expected = options.option_error(section, key, value)
    assert expected
    with pytest.raises(config.ConfigError) as loaded:
        Config.from_dict({section: {key: value}})
    assert str(loaded.value).endswith(expected)
    cfg = Config()
    cfg.set_option(section, key, value)
    if section == "hotfix":
        with pytest.raises(hotfix.HotfixError, match=None) as policy:
            hotfix.settings(cfg)
        assert str(policy.value) == expected
    else:  # the transform reads its options through the same check: the file's one error line
        result = harness.rewrite_result(b"loss.backward()\nopt.step()\n",
                                        Config(transforms=["grad_clip"], options={section: {key: value}}))
        assert expected in result.report.error
