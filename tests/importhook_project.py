"""A project for import-hook tests: a package holding a training step (rewritten on import) and a
plain module (not), a fresh package name per test (``sys.modules`` is shared in-process), and an
import done as a new process would do it. Shared by the import hook's tests and the tests of the
files it writes (tmpnames), so neither imports the other's test file.
"""
import importlib
import os
import sys
import textwrap
import uuid

import pytest

from scalebox_cst import importhook
from scalebox_cst.importhook import session as hook_session
from scalebox_cst.importhook import ENV_SESSION, install_import_hook

PPO = textwrap.dedent(
    '''\
    """A training step as RL code writes it: no clipping."""
    import torch


    def train_step(model, optimizer, x):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss


    def fail(n):
        value = n + 1
        raise ValueError(f"boom {value}")
    '''
)

PLAIN = "def double(x):\n    return 2 * x\n"

CONFIG = 'backend = "cpu"\ntransforms = ["grad_clip"]\n\n[grad_clip]\nmode = "fixed"\nmax_norm = {max_norm}\n'


@pytest.fixture
def proj(tmp_path, writes_caches):
    """A project with a package holding a training step (rewritten) and a plain module (not);
    Python writes caches (``writes_caches``: the hook's cache is what many of these tests test)."""
    pkg = f"agents_{uuid.uuid4().hex[:8]}"
    root = tmp_path / "proj"
    (root / pkg).mkdir(parents=True)
    (root / "scalebox.toml").write_text(CONFIG.format(max_norm=1.0))
    (root / pkg / "__init__.py").write_text("")
    (root / pkg / "ppo.py").write_text(PPO)
    (root / pkg / "plain.py").write_text(PLAIN)
    sys.path.insert(0, str(root))
    hooks_before = list(sys.meta_path)
    yield root, pkg
    sys.path.remove(str(root))
    for finder in list(sys.meta_path):
        if finder not in hooks_before and isinstance(finder, importhook.ImportHook):
            finder.uninstall()
    for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
        del sys.modules[name]
    # a fresh session for the next test (one per process otherwise), and no session in our env
    hook_session._SESSION = None
    hook_session._ROOTS.clear()
    os.environ.pop(ENV_SESSION, None)


def _fresh_import(root, pkg, name="ppo", **options):
    """Import ``pkg.name`` as a new process would: no module, no hook state, a new hook."""
    for mod in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
        del sys.modules[mod]
    hook_session._ROOTS.clear()
    hook_session._SEEN.clear()
    with install_import_hook([pkg], project=str(root), **options) as hook:
        return importlib.import_module(f"{pkg}.{name}"), hook
