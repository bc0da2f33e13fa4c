"""Configuration: files, globs, transform selection, fingerprint."""
from conftest import TESTS  # tests/: the corpus, fake_torch_npu and the repository root beside it
import os
import re

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


# ---------------------------------------------------------------------------- checked input (issue 9, items 11-12)
@pytest.mark.parametrize(
    "text, message",
    [
        ("[grad_clip]\nmax_nrom = 0.5", "unknown option grad_clip.max_nrom (did you mean 'max_norm'?)"),
        ("[grad_clp]\nmax_norm = 0.5", "unknown option table [grad_clp] (did you mean 'grad_clip'?)"),
        ("[grad_clip]\nmax_norm = nan", "grad_clip.max_norm must be a positive number, got nan"),
        ("[grad_clip]\nmax_norm = inf", "must be a positive number, got inf"),
        ("[grad_clip]\nmax_norm = true", "must be a positive number, got True"),
        ('[vectorize.target_update]\nallow_lerp = "yes"', "allow_lerp must be true or false, got 'yes'"),
        ("[vectorize.recurrance]\nreassociate = false", "did you mean 'vectorize.recurrence'?"),
        ("[device]\nallow_tf23 = true", "did you mean 'allow_tf32'?"),
        ("backnd = 'cpu'", "unknown key 'backnd' (did you mean 'backend'?)"),
    ],
)
def test_unknown_names_and_bad_values_are_one_line_errors(tmp_path, text, message):
    (tmp_path / "scalebox.toml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config.load(str(tmp_path))
    (tmp_path / "scalebox.toml").unlink()
    (tmp_path / "pyproject.toml").write_text("[tool.scalebox]\n" + text.replace("[", "[tool.scalebox."))
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config.load(str(tmp_path))


def test_dotted_tables_are_read_as_their_section(tmp_path):
    (tmp_path / "scalebox.toml").write_text("[vectorize.recurrence]\nreassociate = false\n[vectorize.target_update]\nallow_lerp = true\n")
    cfg = Config.load(str(tmp_path))
    assert cfg.option("vectorize.recurrence", "reassociate") is False  # was silently ignored
    assert cfg.option("vectorize.target_update", "allow_lerp") is True


def test_non_utf8_config_is_one_line(tmp_path):
    (tmp_path / "scalebox.toml").write_bytes(b'transforms = ["grad_clip"]\n# caf\xe9\n')
    with pytest.raises(ConfigError, match=r"scalebox.toml:2: not UTF-8 \(byte 0xe9\)"):
        Config.load(str(tmp_path))


def test_unknown_transform_ids_are_errors_when_the_pipeline_is_built(tmp_path):
    from scalebox_cst.pipeline import Pipeline

    (tmp_path / "scalebox.toml").write_text('transforms = ["grad_clip", "no_such"]\n')
    with pytest.raises(ConfigError, match="transforms: unknown transform 'no_such'"):
        Pipeline(Config.load(str(tmp_path)), "cpu")
    with pytest.raises(ConfigError, match="did you mean 'vectorize.elementwise'"):
        Pipeline(Config(disabled=["vectorize.elementwse"]), "cpu")
    Pipeline(Config(transforms=["vectorize.*", "device.placement"], disabled=["grad_*"]), "cpu")


def _literal_option_reads():
    """(section, key) of every ``ctx.option(SECTION, "key", ...)`` with a literal key in the
    transform modules, SECTION resolved through the module's string constants."""
    import ast
    import pathlib

    found = set()
    folder = pathlib.Path(TESTS).parent / "transforms"
    for path in folder.rglob("*.py"):
        tree = ast.parse(path.read_text())
        consts = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "option" and len(node.args) >= 2:
                sec, key = node.args[0], node.args[1]
                section = sec.value if isinstance(sec, ast.Constant) else consts.get(sec.id) if isinstance(sec, ast.Name) else None
                if section == "device" or (isinstance(sec, ast.Attribute) and sec.attr == "SECTION"):
                    section = "device"
                if isinstance(key, ast.Constant) and section:
                    found.add((section, key.value))
    return found


def test_every_option_a_transform_reads_is_known_to_the_config():
    from scalebox_cst.config import OPTIONS
    from scalebox_cst.transforms import device_table, grad_clip

    reads = _literal_option_reads()
    assert ("grad_clip", "max_norm") in reads and ("vectorize.target_update", "allow_lerp") in reads
    reads |= {("grad_clip", key) for key in getattr(grad_clip, "GUARD_DEFAULTS", {})}
    reads |= {("device", e.option) for e in device_table.TABLE if getattr(e, "option", None)}
    try:
        from scalebox_cst import hotfix
    except ImportError:  # the hot-fix policy is optional here
        hotfix = None
    if hotfix is not None:
        reads |= {(hotfix.SECTION, key) for key in hotfix.DEFAULTS}
    missing = sorted(f"{s}.{k}" for s, k in reads if k not in OPTIONS.get(s, {}))
    assert not missing, f"add to config.OPTIONS: {missing}"


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("scalebox.toml", "include = " + "[" * 5000 + "]" * 5000, "scalebox.toml: values nested too deeply to read"),
        ("scalebox.toml", "[grad_clip]\nmode = " + "{a=" * 3000 + "1" + "}" * 3000, "values nested too deeply to read"),
        ("pyproject.toml", "tool = 1", "pyproject.toml: tool must be a table ([tool]), got 1"),
        ("pyproject.toml", "[tool]\nscalebox = 5", "pyproject.toml: tool.scalebox must be a table ([tool.scalebox]), got 5"),
        ("pyproject.toml", "[tool]\nscalebox = [1, 2]", "tool.scalebox must be a table ([tool.scalebox]), got [1, 2]"),
        ("scalebox.toml", "grad_clip = 3", "scalebox.toml: grad_clip must be a table ([grad_clip]), got 3"),
        ("scalebox.toml", "vectorize = 'x'", "vectorize must be a table ([vectorize]), got 'x'"),
        ("scalebox.toml", "[grad_clip]\nz = " + "9" * 400, None),
        ("scalebox.toml", "[grad_clip]\nmode = " + "[" * 200 + "]" * 200, "grad_clip.mode must be one of guard, fixed, got [[[[[[[...]]]]]]]"),
        ("scalebox.toml", "[grad_clip]\nmode = '" + "x" * 5000 + "'", "grad_clip.mode must be one of guard, fixed, got '" + "x" * 27 + "..." + "x" * 28 + "'"),
    ],
)
def test_type_confusion_and_deep_nesting_in_config_are_one_line_errors(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    if message is None:  # a huge integer is a (finite) number: accepted, no OverflowError
        assert Config.load(str(tmp_path)).option("grad_clip", "z") == int("9" * 400)
        return
    with pytest.raises(ConfigError) as exc:
        Config.load(str(tmp_path))
    assert str(exc.value).endswith(message) and "\n" not in str(exc.value)


def test_a_config_file_too_large_or_not_regular_is_not_read(tmp_path, monkeypatch):
    import os

    from scalebox_cst import config

    (tmp_path / "scalebox.toml").write_text("# " + "x" * 200 + "\n")
    monkeypatch.setattr(config, "MAX_CONFIG_BYTES", 100)
    with pytest.raises(ConfigError, match=r"scalebox.toml: larger than 100 bytes \(203 bytes\); not read"):
        Config.load(str(tmp_path))
    os.remove(tmp_path / "scalebox.toml")
    os.mkfifo(tmp_path / "pyproject.toml")  # not a regular file: not read (an open would wait for a writer)
    with pytest.raises(ConfigError, match=r"pyproject.toml: a FIFO, not a regular file; not read$"):
        Config.load(str(tmp_path))  # said, not passed over as if there were no config


@pytest.mark.parametrize("make, said", [
    (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
    (lambda p: os.symlink("/dev/zero", p), "a device, not a regular file"),
    (lambda p: os.symlink("missing.toml", p), "a link to a missing file"),
    (lambda p: os.mkdir(p), "a folder, not a regular file"),
])
def test_a_config_that_is_there_but_not_a_file_is_a_one_line_error_not_the_defaults(tmp_path, make, said):
    """Found by the fifth fault campaign: a ``scalebox.toml`` that was a FIFO, a link to a device or
    to nothing was passed over in silence, and the commands ran on the defaults."""
    make(str(tmp_path / "scalebox.toml"))
    with pytest.raises(ConfigError) as exc:
        Config.load(str(tmp_path))
    assert str(exc.value) == f"{tmp_path / 'scalebox.toml'}: {said}; not read"


def test_many_double_stars_match_in_linear_steps(monkeypatch):
    """``**/**/.../x.py`` tried every split of every ``**``: 12 of them never finished on a deep path."""
    from scalebox_cst import config

    calls = []
    real = config.fnmatch.fnmatchcase
    monkeypatch.setattr(config.fnmatch, "fnmatchcase", lambda name, pat: calls.append(1) or real(name, pat))
    cfg = Config(include=["**/" * 12 + "x.py"], exclude=[])
    path = "/".join("abcdefghijklmnop") + "/y.py"
    assert not cfg.includes(path) and cfg.includes("a/b/x.py") and cfg.includes("x.py")
    assert len(calls) < 200


def test_a_set_value_nested_too_deeply_for_json_is_a_one_line_error(tmp_path):
    from click.testing import CliRunner

    from scalebox_cst.cli import cli

    (tmp_path / "a.py").write_text("x = 1\n")
    deep = "[" * 5000 + "]" * 5000
    result = CliRunner().invoke(cli, ["rewrite", str(tmp_path), "--project", str(tmp_path), "--set", f"grad_clip.mode={deep}"])
    assert result.exit_code == 2, result.exception
    assert result.output.strip().splitlines() == [f"scalebox: --set grad_clip.mode={deep}: grad_clip.mode must be one of guard, fixed, got '[[[[[[[[[[[[[[[[[[[[[[[[[[[...]]]]]]]]]]]]]]]]]]]]]]]]]]]]'"]


def test_the_fingerprint_reads_every_core_module_the_pipeline_imports():
    """The rewrite cache and the import hook key rewrites by a digest of the code that makes them:
    a core module the pipeline imports but the digest does not read (the codegen, the spliced
    ast, the emitted rows were all missing once) would serve rewrites its old version made."""
    import subprocess
    import sys

    from scalebox_cst.config import PIPELINE_MODULES, engine_files

    code = ("import sys; before = set(sys.modules); import scalebox_cst.pipeline; "
            "print(' '.join(sorted(m for m in sys.modules if m not in before and m.count('.') == 1 "
            "and m.startswith('scalebox_cst.'))))")
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    modules = {m.split(".", 1)[1] + ".py" for m in imported} - {"_version.py", "transforms.py", "runtime.py"}
    assert modules and modules <= set(PIPELINE_MODULES), sorted(modules - set(PIPELINE_MODULES))
    _, files = engine_files()
    assert set(PIPELINE_MODULES) <= {name for _, name in files}
