"""Spawn and forkserver children of a run execute the committed rewrite, not the files on disk.

multiprocessing re-imports the parent's main module in such children, and they start without the
executor's finder: without help they would run the user's current script and modules from disk.
Each test commits a project, then changes the script and a module on disk, so a child that read
either from disk says so (or fails loudly).
"""
import json
import textwrap

import pytest

from scalebox_cst.importhook import ENV_MAIN

from conftest import scalebox

SCRIPT = textwrap.dedent(
    """\
    import multiprocessing as mp
    import sys

    import torch

    import helpers


    def train():  # a grad_clip site: the rewrite imports its helper (a _scalebox_* name) at the top
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(torch.ones(1, 2)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


    def probe(tag):
        import helpers as h
        from nested import deep

        main = sys.modules["__main__"]
        return tag, h.MARK, deep.MARK, any(k.startswith("_scalebox_") for k in vars(main)), __name__


    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        with ctx.Pool(2) as pool:
            for tag, mark, deep_mark, rewritten, name in pool.map(probe, ["a", "b"]):
                print("child", tag, mark, deep_mark, rewritten, name)
        proc = ctx.Process(target=probe, args=("p",))
        proc.start()
        proc.join()
        print("process exit", proc.exitcode)
        print("parent", helpers.MARK, any(k.startswith("_scalebox_") for k in globals()))
    """
)

# What the script says once edited on disk: a child that imports it reports "disk" at once.
DISK_SCRIPT = "def probe(tag):\n    return tag, 'disk', 'disk', False, 'disk'\n"


@pytest.fixture
def committed(project):
    """``project`` with SCRIPT committed to run/0001, then its files changed on disk."""
    (project / "train.py").write_text(SCRIPT)
    (project / "helpers.py").write_text("MARK = 'committed'\n")
    (project / "nested").mkdir()
    (project / "nested" / "__init__.py").write_text("")
    (project / "nested" / "deep.py").write_text("MARK = 'committed-deep'\n")
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    report = json.loads(scalebox("rewrite", str(project), "--json").stdout)
    assert report["branch"] == "run/0001"
    # the user keeps editing: none of this may reach the run of run/0001
    (project / "train.py").write_text(DISK_SCRIPT)
    (project / "helpers.py").write_text("MARK = 'disk'\n")
    (project / "nested" / "deep.py").write_text("MARK = 'disk-deep'\n")
    return project


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_children_run_the_commit(committed, method):
    proc = scalebox("run", "run/0001", "train.py", "--", method, cwd=committed, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    children = sorted(line for line in lines if line.startswith("child"))
    assert children == [
        "child a committed committed-deep True __mp_main__" if method != "fork" else "child a committed committed-deep True __main__",
        "child b committed committed-deep True __mp_main__" if method != "fork" else "child b committed committed-deep True __main__",
    ], proc.stdout
    assert "process exit 0" in lines
    assert "parent committed True" in lines
    assert "disk" not in proc.stdout + proc.stderr


def test_child_tracebacks_show_the_committed_lines(project):
    """A child's traceback quotes the rewritten script (the lines that ran), not the disk file."""
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    (project / "train.py").write_text(
        SCRIPT.replace("    return tag, h.MARK", "    if tag == 'p':\n        raise ValueError('child failed here')\n    return tag, h.MARK")
    )
    (project / "helpers.py").write_text("MARK = 'committed'\n")
    (project / "nested").mkdir()
    (project / "nested" / "__init__.py").write_text("")
    (project / "nested" / "deep.py").write_text("MARK = 'x'\n")
    scalebox("rewrite", str(project))
    (project / "train.py").write_text("# edited on disk\n" * 40 + DISK_SCRIPT)
    proc = scalebox("run", "run/0001", "train.py", "--", "spawn", cwd=project, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "process exit 1" in proc.stdout
    assert "raise ValueError('child failed here')" in proc.stderr  # the script's stderr
    assert "edited on disk" not in proc.stdout + proc.stderr


ASYNC_ENV_SCRIPT = textwrap.dedent(
    """\
    import gymnasium as gym
    import numpy as np
    from gymnasium.vector import AsyncVectorEnv

    import envs


    if __name__ == "__main__":
        vec = AsyncVectorEnv([envs.make for _ in range(2)], context="spawn")
        obs, _ = vec.reset(seed=0)
        obs, reward, term, trunc, info = vec.step(np.zeros(2, dtype=np.int64))
        vec.close()
        print("rewards", reward.tolist())
    """
)

ENVS = textwrap.dedent(
    """\
    import gymnasium as gym
    import numpy as np

    REWARD = {reward}


    class Const(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(1, np.float32), {{}}

        def step(self, action):
            return np.zeros(1, np.float32), REWARD, False, False, {{}}


    def make():
        return Const()
    """
)


def test_gymnasium_async_vector_env_spawn_workers_use_the_commit(project):
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    (project / "train.py").write_text(ASYNC_ENV_SCRIPT)
    (project / "envs.py").write_text(ENVS.format(reward=1.0))
    scalebox("rewrite", str(project))
    (project / "envs.py").write_text(ENVS.format(reward=-7.0))
    proc = scalebox("run", "run/0001", "train.py", cwd=project, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rewards [1.0, 1.0]" in proc.stdout


def test_a_run_started_under_an_import_hook_run_serves_its_own_commit(committed):
    """``scalebox run`` started from inside ``python -m scalebox_cst`` (whose variable is then in
    the environment): the run's children re-create the run's script, not the hook's."""
    hook_main = json.dumps({"script": str(committed / "train.py"), "packages": [], "project": str(committed), "backend": "cpu", "cache": True})
    proc = scalebox(
        "run", "run/0001", "train.py", "--", "spawn", cwd=committed, check=False, timeout=120, env={ENV_MAIN: hook_main}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "child a committed committed-deep True __mp_main__" in proc.stdout.splitlines(), proc.stdout
