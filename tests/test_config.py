"""Configuration: files, globs, transform selection, fingerprint."""
import pytest

from scalebox_cst.config import DEFAULT_TOML, Config, ConfigError


def test_defaults_when_no_file(tmp_path):
    cfg = Config.load(str(tmp_path))
    assert cfg.option("grad_clip", "max_norm", 1.0) == 1.0
    assert cfg.transform_enabled("grad_clip") and cfg.transform_enabled("vectorize.recurrence")


def test_default_toml_is_valid_and_equals_defaults(tmp_path):
    (tmp_path / "scalebox.toml").write_text(DEFAULT_TOML)
    cfg = Config.load(str(tmp_path))
    assert cfg.option("grad_clip", "max_norm") == 1.0
    assert cfg.transforms == Config().transforms and cfg.backend == "auto"


def test_pyproject_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.scalebox]\ntransforms = ["grad_clip"]\n[tool.scalebox.grad_clip]\nmax_norm = 0.5\n')
    cfg = Config.load(str(tmp_path))
    assert cfg.option("grad_clip", "max_norm") == 0.5
    assert not cfg.transform_enabled("vectorize.recurrence")


@pytest.mark.parametrize(
    "text, message",
    [
        ("backend = 'tpu'", "backend must be one of"),
        ("include = 'x'", "include must be a list"),
        ("[grad_clip]\nmax_norm = -1", "max_norm must be a positive"),
        ("bogus = 1", "unknown key"),
        ("include = [", "scalebox.toml"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    (tmp_path / "scalebox.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        Config.load(str(tmp_path))


@pytest.mark.parametrize(
    "path, included",
    [
        ("train.py", True),
        ("agents/ppo.py", True),
        ("data.csv", False),
        (".venv/lib/x.py", False),
        (".scalebox/x.py", False),
        ("pkg/__pycache__/x.py", False),
        ("build/lib/x.py", False),
    ],
)
def test_include_exclude(path, included):
    assert Config().includes(path) is included


def test_fingerprint_changes_with_options_and_backend():
    a = Config()
    b = Config()
    b.set_option("grad_clip", "max_norm", 0.5)
    versions = {"grad_clip": "1"}
    assert a.fingerprint(versions, "cpu") == Config().fingerprint(versions, "cpu")
    assert a.fingerprint(versions, "cpu") != b.fingerprint(versions, "cpu")
    assert a.fingerprint(versions, "cpu") != a.fingerprint(versions, "npu")
    assert a.fingerprint(versions, "cpu") != a.fingerprint({"grad_clip": "2"}, "cpu")
