import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

# The engine signs its caches with a key in the user's cache folder (scalebox_cst.userkey): the
# tests, and the commands they start, keep theirs in a folder of this session's own.
_KEY_HOME = tempfile.mkdtemp(prefix="scalebox-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _KEY_HOME
os.environ.pop("SCALEBOX_CACHE_DIR", None)
atexit.register(shutil.rmtree, _KEY_HOME, True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = HERE  # tests moved into folders that mirror the package find their data here

TRAIN_PY = textwrap.dedent(
    """\
    import argparse
    import torch
    from helpers import make_model  # a project module: must come from the commit too

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x = torch.randn(8, 4) * 100
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step={step} loss={loss.item():.6f}")
    print("final_return=1.5")
    """
)

HELPERS_PY = textwrap.dedent(
    """\
    import torch


    def make_model():
        return torch.nn.Linear(4, 1)
    """
)


@pytest.fixture
def project(tmp_path):
    """A small RL-ish project with a training script and a helper module."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "train.py").write_text(TRAIN_PY)
    (root / "helpers.py").write_text(HELPERS_PY)
    (root / "data.txt").write_text("not python\n")
    return root


def sigint_as_from_a_terminal() -> None:
    """``preexec_fn`` of a child a test interrupts with SIGINT: the default disposition, as under a
    terminal. A shell's background job without job control (``make test &`` in a script) starts
    with SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the test's Ctrl-C
    was ignored (the child hung, or ended 0) though the code under test was right."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def scalebox(*args, cwd=None, check=True, env=None, timeout=120):
    """Run the installed CLI as a user would (a subprocess)."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", "from scalebox_cst.cli import main; main()", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"scalebox {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def newest_branch_holds(watcher, project, rel: str, data: bytes, timeout: float) -> bool:
    """Whether the watcher, left to handle its events, commits ``data`` as ``rel`` on the project's
    newest branch within ``timeout`` seconds (a save it must not lose)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        watcher.process_pending(timeout=0.1)
        store = project.store
        if store.read_file(store.resolve(store.newest_branch()).commit, rel) == data:
            return True
    return False


@pytest.fixture
def writes_caches(monkeypatch):
    """Python as it starts by default, writing bytecode caches, in this process and the ones the
    test starts: the import hook's cache is not written under ``python -B`` or
    ``PYTHONDONTWRITEBYTECODE`` (importhook.cache.may_write), and a shell that exports it must
    not turn the cache's tests into tests of an empty cache."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)


@pytest.fixture(autouse=True)
def _distribution_validation_restored():
    """Each test starts with torch.distributions' default validation as it found it.

    torch.compile's first use calls ``Distribution.set_default_validate_args(False)`` for the
    whole process (torch/_dynamo/eval_frame.py, TorchPatcher.patch): a compiled example earlier
    in the same worker made the distribution tests see validation off.
    """
    dist = sys.modules.get("torch.distributions")
    before = dist.Distribution._validate_args if dist is not None else None
    yield
    dist = sys.modules.get("torch.distributions")
    if dist is not None:
        dist.Distribution.set_default_validate_args(__debug__ if before is None else before)


_RECURSION_LIMIT = sys.getrecursionlimit()


@pytest.fixture(autouse=True)
def _recursion_limit_restored():
    """Each test starts with the recursion limit the session started with.

    torch.compile's inductor raises it to 2,000 for the whole process
    (torch/_inductor/compile_fx.py): a compiled example earlier in the same worker let CPython
    compile the 5,000 nested ``elif``s the nested-code tests hand the engine as input it cannot.
    """
    sys.setrecursionlimit(_RECURSION_LIMIT)
    yield


@pytest.fixture(autouse=True)
def _metrics_left_pending_dropped():
    """Points a test records in runtime.metrics and leaves unflushed go nowhere, and so do the
    gradient guards' histories it leaves in runtime.stabilizer.

    ``metrics.record`` keeps points until 64 are pending (or a flush): a test's last few stayed
    in the worker and were written by whichever later test flushed, into the metrics file that
    test had set, or at the worker's exit (test_stabilizer's AMP test: ``scalebox: non-finite
    scalebox/grad_norm/amp.py:9=nan at step 8`` printed after the session's summary). A guard
    with a partial window records its maximum at exit (test_precision_autocast: ``scalebox:
    non-finite scalebox/grad_norm_clipped=nan at step 5``).
    """
    yield
    stabilizer = sys.modules.get("scalebox_cst.runtime.stabilizer")
    if stabilizer is not None:
        stabilizer.reset()
    metrics = sys.modules.get("scalebox_cst.runtime.metrics")
    if metrics is not None:
        with metrics._lock:
            metrics._pending.clear()


@pytest.fixture
def parses(monkeypatch):
    """Every source libcst's parse_module is handed during the test."""
    import libcst as cst

    seen = []
    real = cst.parse_module

    def counting(source, *args, **kwargs):
        seen.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(cst, "parse_module", counting)
    return seen
