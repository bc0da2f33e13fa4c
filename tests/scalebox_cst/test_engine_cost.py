"""The engine's own cost (issue 20 item 9): what the host process imports, not how long it takes.

Every ``scalebox run`` cost the host 2-3 s of CPU over plain ``python``: backend detection
imported torch, the TensorBoard writer (tensorboardX) imported torch again, and ``status`` / ``run``
imported libcst and every transform for the pipeline fingerprint. ``log``, ``diff`` and
``compare`` imported libcst through the project module. Here each command runs in a subprocess
that reports its ``sys.modules`` at exit; the figures are in benchmarks/bench_engine_cost.py.
"""
import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import scalebox

#: runs the CLI in-process, then prints the heavy modules it loaded as the last line of stderr
TRACE = (
    "import atexit, json, sys\n"
    "HEAVY = ('torch', 'tensorboardX', 'libcst', 'numpy', 'scalebox_cst.pipeline', 'scalebox_cst.transforms')\n"
    "atexit.register(lambda: sys.stderr.write('\\nMODULES ' + json.dumps([m for m in HEAVY if m in sys.modules]) + '\\n'))\n"
    "from scalebox_cst.cli import main\n"
    "sys.argv = ['scalebox', *sys.argv[1:]]\n"
    "main()\n"
)


def loaded(cwd, *args, env):
    proc = subprocess.run([sys.executable, "-c", TRACE, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = [line for line in proc.stderr.splitlines() if line.startswith("MODULES ")][-1]
    return set(json.loads(last[len("MODULES "):]))


@pytest.fixture
def env(tmp_path):
    """The engine's user cache in a fresh folder; no backend from the environment."""
    return dict(os.environ, OMP_NUM_THREADS="1", SCALEBOX_CACHE_DIR=str(tmp_path / "cache"))


def test_commands_import_no_torch_and_readers_no_libcst(project, env):
    (project / "scalebox.toml").write_text('backend = "auto"\n')
    assert {"torch", "tensorboardX"}.isdisjoint(loaded(project, "init", ".", env=env))
    assert {"torch", "tensorboardX"}.isdisjoint(loaded(project, "rewrite", ".", env=env))
    host = loaded(project, "run", "train.py", "--", "--steps", "2", env=env)  # the script's own torch is in its process
    assert {"torch", "tensorboardX", "numpy", "libcst", "scalebox_cst.pipeline"}.isdisjoint(host), host
    assert (project / ".scalebox" / "tensorboard" / "run" / "0001").is_dir()
    host = loaded(project, "run", "--original", "train.py", "--", "--steps", "2", env=env)
    assert {"torch", "tensorboardX", "libcst"}.isdisjoint(host), host
    for args in (["log"], ["diff"], ["diff", "--stat"], ["status"], ["status", "--json"], ["compare", "run/0001", "original"]):
        mods = loaded(project, *args, env=env)
        assert {"torch", "tensorboardX", "libcst", "scalebox_cst.pipeline", "scalebox_cst.transforms"}.isdisjoint(mods), (args, mods)


def test_status_after_a_config_change_still_sees_it_without_the_pipeline(project, env):
    scalebox("rewrite", ".", "--backend", "cpu", cwd=project, env=env)
    (project / "scalebox.toml").write_text('backend = "cpu"\n[grad_clip]\nmax_norm = 3.0\n')
    out = json.loads(scalebox("status", "--json", cwd=project, env=env).stdout)
    assert out["config_changed"] is True
    assert "libcst" not in loaded(project, "status", env=env)


def test_project_fingerprint_is_the_pipelines(project, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEBOX_CACHE_DIR", str(tmp_path / "cache"))
    code = (
        "import sys; from scalebox_cst.project import Project; p = Project(sys.argv[1]); fp = p.fingerprint; "
        "print('transforms' if 'scalebox_cst.transforms' in sys.modules else 'catalog'); print(fp == p.pipeline.fingerprint)"
    )
    (project / "scalebox.toml").write_text('backend = "cpu"\ndisabled = ["grad_clip"]\n')
    runs = [subprocess.run([sys.executable, "-c", code, str(project)], capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert [r.stdout.split() for r in runs] == [["transforms", "True"], ["catalog", "True"]], [r.stderr for r in runs]


def py(code, *args, env=None):
    """``code`` in a fresh interpreter (sys.modules as a CLI process starts); its stdout as JSON."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


CATALOG = (
    "import json, sys; from scalebox_cst import catalog\n"
    "if sys.argv[1:] == ['edited']: catalog.engine_digest = lambda: '0123456789abcdef'\n"
    "found = catalog.transform_versions()\n"
    "print(json.dumps([found, 'scalebox_cst.transforms' in sys.modules, catalog.engine_digest()]))\n"
)


def test_catalog_matches_the_registry_and_is_keyed_by_the_transform_code(tmp_path):
    from scalebox_cst.transforms import versions

    env = dict(os.environ, SCALEBOX_CACHE_DIR=str(tmp_path))
    found, imported, digest = py(CATALOG, env=env)
    assert found == versions() and imported  # a miss: the registry is imported, the answer kept
    (cached,) = os.listdir(tmp_path)
    assert digest in cached
    assert py(CATALOG, env=env) == [versions(), False, digest]  # a hit: no transform imported
    with open(tmp_path / cached, "w") as fh:  # the file is what answers while the code is the same
        json.dump([["grad_clip", "from-the-cache"]], fh)
    assert py(CATALOG, env=env)[:2] == [{"grad_clip": "from-the-cache"}, False]
    assert py(CATALOG, "edited", env=env)[:2] == [versions(), True]  # edited transform code: another key


# ----------------------------------------------------------------------------- backend probe
PROBE = (
    "import dataclasses, json, sys; from scalebox_cst.runtime import backend\n"
    "info = backend.probe()\n"
    "print(json.dumps([dataclasses.asdict(info), 'torch' in sys.modules, backend.torch_build()]))\n"
)


def test_probe_reads_a_cpu_torch_off_the_installation(tmp_path):
    env = dict(os.environ, SCALEBOX_CACHE_DIR=str(tmp_path))
    info, imported, build = py(PROBE, env=env)
    if build is None or build[1] or build[2]:
        pytest.skip("needs a torch built without CUDA/ROCm")
    assert not imported and not os.listdir(tmp_path)  # neither torch nor a probing subprocess
    assert info == {"name": "cpu", "device_name": None, "torch_version": build[0], "notes": []}


def test_probe_without_torch_says_so_as_detect_does(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    code = ("from scalebox_cst.runtime.backend import detect, probe; import dataclasses, json; "
            "print(json.dumps([dataclasses.asdict(probe()), dataclasses.asdict(detect())]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")]))
    probed, detected = py(code, env=env)
    assert probed == detected and detected["name"] == "cpu" and "torch" in detected["notes"][0]


GPU_PROBE = (
    "import dataclasses, json, subprocess, sys; from scalebox_cst.runtime import backend\n"
    "backend.torch_build = lambda spec=None: ('2.9.0+cu128', '12.8', None)\n"
    "backend.GPU_NODES = (sys.argv[1],)  # a device node exists\n"
    "calls = []\n"
    "real = subprocess.run\n"
    "backend.subprocess.run = lambda cmd, **kw: calls.append(cmd) or real(cmd, **kw)\n"
    "info = backend.probe()\n"
    "print(json.dumps([dataclasses.asdict(info), len(calls), 'torch' in sys.modules]))\n"
)


def test_probe_with_a_gpu_build_and_device_asks_a_subprocess_once(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, SCALEBOX_CACHE_DIR=str(cache))
    detected = py("from scalebox_cst.runtime.backend import detect; import dataclasses, json; print(json.dumps(dataclasses.asdict(detect())))")
    assert py(GPU_PROBE, str(tmp_path), env=env) == [detected, 1, False]  # asked detect() in a subprocess
    assert len(os.listdir(cache)) == 1
    assert py(GPU_PROBE, str(tmp_path), env=env) == [detected, 0, False]  # cached: no subprocess
    env["CUDA_VISIBLE_DEVICES"] = ""  # other visible devices: asked again
    assert py(GPU_PROBE, str(tmp_path), env=env) == [detected, 1, False]


# ----------------------------------------------------------------------------- TensorBoard
def test_crc32c_known_answer():
    from scalebox_cst import tbevents

    assert tbevents.crc32c(b"123456789") == 0xE3069283
    assert tbevents.crc32c(b"") == 0


def _records(data):
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        out.append(data[pos:pos + 16 + length])
        pos += 16 + length
    return out


def test_event_files_are_tensorboardx_bytes(tmp_path):
    tensorboardX = pytest.importorskip("tensorboardX")
    from scalebox_cst import tbevents

    points = [("loss", 0.5, 3, 1000.25), ("a b/c", 1e40, -2, 1001.0), ("/x", float("nan"), 7, 1002.0),
              ("ret", -3, 2 ** 40, 1003.5), ("héllo", float("-inf"), 0, 1004.0), ("zero", 0.0, 0, 1005.0), ("negzero", -0.0, 1, 1006.0)]
    theirs = tensorboardX.SummaryWriter(logdir=str(tmp_path / "x"))
    for tag, value, step, wall in points:
        theirs.add_scalar(tag, value, global_step=step, walltime=wall)
    theirs.close()
    ours = tbevents.ScalarWriter(str(tmp_path / "y"))
    assert ours.add(points) == len(points)
    ours.close()
    (a,), (b,) = os.listdir(tmp_path / "x"), os.listdir(tmp_path / "y")
    assert b.startswith("events.out.tfevents.")
    ra, rb = (_records((tmp_path / d / n).read_bytes()) for d, n in (("x", a), ("y", b)))
    assert ra[1:] == rb[1:]  # the first record is the file version, with the file's own time
    from tensorboardX.proto import event_pb2

    assert event_pb2.Event.FromString(rb[0][12:-4]).file_version == "brain.Event:2"


def test_an_unwritable_tensorboard_folder_is_one_notice_and_the_metrics_go_on(tmp_path, monkeypatch):
    from scalebox_cst.runner import execution as executor

    monkeypatch.setattr(executor._TensorBoard, "warned", False)
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "metrics.jsonl").write_text('{"name": "loss", "step": 0, "value": 1.5, "time": 1.0}\n')
    notes = []
    tb = [executor._TensorBoard(str(tmp_path / "file" / f"run{i}"), notes.append) for i in range(2)]
    assert len(notes) == 1 and "\n" not in notes[0] and "cannot write" in notes[0] and str(tmp_path / "file") in notes[0]
    assert tb[0].pump(str(tmp_path / "metrics.jsonl")) == 1  # the tailer still sees the run's metrics
    tb[0].close()
