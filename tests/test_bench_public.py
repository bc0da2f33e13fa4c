"""benchmarks/bench_public_scripts.py: the committed manifest names enough public scripts, by
commit, none of them this repository's test corpus; the harness serves both gym APIs and ends a
run at its step budget; a manifest entry with a missing repository fails with one line.
"""
import harness
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def load_bench():
    return harness.load_path(os.path.join(BENCH, "bench_public_scripts.py"), "bench_public_scripts")


def test_manifest_names_public_scripts_by_commit():
    bench = load_bench()
    manifest = bench.load_manifest(os.path.join(BENCH, "public_scripts.json"))
    scripts = manifest["scripts"]
    assert len(scripts) >= 8 and len({s["repo"] for s in scripts}) >= 5
    assert len({s["name"] for s in scripts}) == len(scripts)
    corpus = os.listdir(os.path.join(ROOT, "tests", "corpus")) if os.path.isdir(os.path.join(ROOT, "tests", "corpus")) else []
    for s in scripts:
        assert re.fullmatch(r"[0-9a-f]{40}", s["commit"]), s
        assert "/" in s["repo"] and not s["path"].startswith("tests/"), s
        assert s.get("gym", "") in ("", "gymnasium", "legacy"), s
    assert not any(s["name"] in corpus for s in scripts)


def test_missing_repository_is_one_line(tmp_path):
    bench = load_bench()
    with pytest.raises(SystemExit) as exc:
        bench.read_source(str(tmp_path), "nobody/nothing", "0" * 40, "x.py", fetch=False)
    assert "nobody/nothing is not in the cache" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("api", ["legacy", "gymnasium"])
def test_harness_serves_gym_and_caps_steps(tmp_path, api):
    pytest.importorskip("gymnasium")
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import gym
        env = gym.make("CartPole-v1")
        out = env.reset()
        print("reset", type(out).__name__)
        n = 0
        while True:
            res = env.step(env.action_space.sample())
            n += 1
            print("step", len(res), n)
            if res[2] if len(res) == 4 else (res[2] or res[3]):
                env.reset()
    """))
    env = dict(os.environ, SB_BENCH_GYM=api, SB_BENCH_MAX_STEPS="25")
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "_public_harness.py"), str(script)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("reset ndarray" if api == "legacy" else "reset tuple")
    assert lines[-1] == f"step {4 if api == 'legacy' else 5} 25"
