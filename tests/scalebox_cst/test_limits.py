"""Runs under limits (issue 24 part 3): what `scalebox run --memory/--cpus/--priority/--no-network`
and `[run]` enforce, on this host's best mechanism, through the plain, torchrun and Ray launchers."""
from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
import time
import types

import pytest

from scalebox_cst import limits, runs
from scalebox_cst.config import Config, ConfigError

from conftest import scalebox

PROBE = textwrap.dedent(
    """\
    import json, os, resource, socket, sys
    what = {"affinity": sorted(os.sched_getaffinity(0)), "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "data": resource.getrlimit(resource.RLIMIT_DATA)[0], "rank": os.environ.get("RANK"),
            "cgroup": open("/proc/self/cgroup").read().strip().splitlines()[-1]}
    port = int(os.environ.get("LISTENER", "0"))
    if port:
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            what["connect"] = "connected"
        except OSError as exc:
            what["connect"] = type(exc).__name__
    print("probe " + json.dumps(what), flush=True)
    if "--hog" in sys.argv:
        block = []
        while True:
            block.append(bytearray(16 << 20))
    """
)


@pytest.fixture
def probe_project(project):
    (project / "probe.py").write_text(PROBE)
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("rewrite", str(project))
    return project


def _probes(text):
    return [json.loads(line.split(" ", 1)[1]) for line in text.splitlines() if line.startswith("probe ")]


def _only_run(project):
    [run] = runs.list_runs(str(project))
    return run.record


def test_a_memory_hog_under_300m_fails_in_seconds_naming_the_limit(probe_project):
    started = time.time()
    proc = scalebox("run", "--memory", "300m", "probe.py", "--", "--hog", cwd=probe_project, check=False, timeout=60)
    assert time.time() - started < 30
    assert proc.returncode != 0
    record = _only_run(probe_project)
    assert record["status"] == "failed"
    assert record["stop_reason"] == "memory limit 300m reached", proc.stderr
    assert record["limits"]["memory"].startswith("300m (")
    assert "memory limit 300m reached" in proc.stderr  # the end line says why
    pgid = record["pgid"]
    with pytest.raises(ProcessLookupError):  # its process group is gone
        os.killpg(pgid, 0)


@pytest.mark.parametrize("size", ["10b", "1m", "16m"])
def test_a_limit_too_small_for_the_interpreter_is_named_as_the_cause(probe_project, size):
    """Under RLIMIT_DATA a limit below what Python and the launcher need ends the run with the
    dynamic loader's message, a thread that cannot start, a module that cannot map or a SIGSEGV
    (malloc's NULL in C code): none said MemoryError, and the run read as failed for no reason."""
    proc = scalebox("run", "--memory", size, "probe.py", cwd=probe_project, check=False, timeout=60)
    assert proc.returncode != 0
    record = _only_run(probe_project)
    assert record["status"] == "failed" and record["stop_reason"] == f"memory limit {size} reached", (record, proc.stderr)
    assert f"memory limit {size} reached" in proc.stderr


def test_without_a_limit_the_same_allocation_is_no_limit_failure(probe_project):
    """A failure that is not a limit's keeps stop_reason empty (the reason is not guessed)."""
    (probe_project / "boom.py").write_text("raise SystemExit(3)\n")
    scalebox("rewrite", str(probe_project))
    proc = scalebox("run", "--memory", "300m", "boom.py", cwd=probe_project, check=False)
    assert proc.returncode == 3
    record = _only_run(probe_project)
    assert record["status"] == "failed" and record["stop_reason"] is None


def test_a_cpu_limited_low_priority_run(probe_project):
    proc = scalebox("run", "--cpus", "1", "--priority", "low", "probe.py", cwd=probe_project)
    [seen] = _probes(proc.stdout)
    record = _only_run(probe_project)
    assert record["status"] == "ok" and set(record["limits"]) == {"cpus", "priority"}
    assert seen["nice"] == limits.NICE["low"]
    if "affinity" in record["limits"]["cpus"]:  # the fallback: one core's affinity
        assert len(seen["affinity"]) == 1
    else:  # a cgroup of the run's own
        assert seen["cgroup"].rsplit("/", 1)[-1].startswith("scalebox-")
    assert "limits: " in proc.stderr  # one line says what is enforced


def test_no_network_blocks_a_connect_to_a_local_listener(probe_project):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = str(listener.getsockname()[1])
    try:
        free = scalebox("run", "probe.py", cwd=probe_project, env={"LISTENER": port})
        assert _probes(free.stdout)[0]["connect"] == "connected"  # the listener is reachable without the limit
        proc = scalebox("run", "--no-network", "probe.py", cwd=probe_project, env={"LISTENER": port}, check=False)
    finally:
        listener.close()
    if proc.returncode == 2:  # a kernel that refuses network namespaces: one line, nothing run
        assert proc.stderr.strip().splitlines()[-1].startswith("scalebox: no network: this kernel"), proc.stderr
        return
    assert _probes(proc.stdout)[0]["connect"] in ("ConnectionRefusedError", "OSError", "TimeoutError"), proc.stdout


def test_run_table_in_scalebox_toml_is_inherited_and_options_override_it(probe_project):
    (probe_project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n[run]\nmemory = "2g"\npriority = "low"\n')
    proc = scalebox("run", "--memory", "1g", "probe.py", cwd=probe_project)
    [seen] = _probes(proc.stdout)
    record = _only_run(probe_project)
    assert record["limits"]["memory"].startswith("1g") and record["limits"]["priority"].startswith("low")
    if "RLIMIT_DATA" in record["limits"]["memory"]:
        assert seen["data"] == 1 << 30
    assert seen["nice"] == limits.NICE["low"]


@pytest.mark.parametrize("table, message", [
    ('memory = "4x"', "run.memory must be a size such as 4g or 300m, got '4x'"),
    ("cpus = 0", "run.cpus must be a positive number, got 0"),
    ('priority = "urgent"', "run.priority must be one of low, normal, high, got 'urgent'"),
    ('network = "no"', "run.network must be true or false, got 'no'"),
    ("memroy = 1", "unknown option run.memroy (did you mean 'memory'?)"),
    ('memory = "8589934592g"', "run.memory = '8589934592g' is larger than any machine's address space"),
    ("memory = 9223372036854775807", "run.memory = 9223372036854775807 is larger than any machine's address space"),
    ('device_memory = "' + "9" * 400 + 'g"', "is larger than any machine's address space"),
])
def test_bad_run_table_is_one_line(tmp_path, table, message):
    (tmp_path / "scalebox.toml").write_text(f"[run]\n{table}\n")
    with pytest.raises(ConfigError) as err:
        Config.load(str(tmp_path)).check_options()
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("args, message", [
    (["--memory", "lots"], "scalebox: bad size 'lots': expected a number with k, m, g or t, e.g. 4g or 300m"),
    (["--cpus", "-1"], "scalebox: scalebox run: cpus must be a positive number, got -1.0"),
    # these overflowed setrlimit in the child: "Exception occurred in preexec_fn", a half run folder
    (["--memory", "99999999999999999999g"], "scalebox: bad size '99999999999999999999g': larger than any machine's address space (at most 65536t)"),
    (["--memory", "9223372036854775807"], "scalebox: bad size '9223372036854775807': larger than any machine's address space (at most 65536t)"),
    (["--memory", "0.1b"], "scalebox: bad size '0.1b': expected a number with k, m, g or t, e.g. 4g or 300m, of at least one byte"),
])
def test_bad_options_are_one_line_and_start_nothing(probe_project, args, message):
    proc = scalebox("run", *args, "probe.py", cwd=probe_project, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == message, proc.stderr
    assert runs.list_runs(str(probe_project)) == []


def test_sizes():
    assert limits.parse_size("4g") == 4 << 30 and limits.parse_size("300M") == 300 << 20
    assert limits.parse_size("1.5GiB") == 3 << 29 and limits.parse_size(4096) == 4096
    assert limits.format_size(300 << 20) == "300m" and limits.format_size(3 << 29) == "1.5g"
    assert limits.parse_size("65536t") == 1 << 56
    for bad in ("", "-1g", "0", "4 gigs", True, 1.5, "65537t", (1 << 56) + 1, "0.5", "9" * 400 + "g"):
        with pytest.raises(limits.LimitError):
            limits.parse_size(bad)


def test_a_cgroup_v2_is_written_with_the_limits(tmp_path):
    """The cgroup path (cgroup v2 is not mounted on every test host): a fake hierarchy."""
    parent = tmp_path / "cg"
    parent.mkdir()
    (parent / "cgroup.subtree_control").write_text("cpu\n")
    lim = limits.Limits(memory=300 << 20, cpus=1.5, priority="high")
    path = limits.make_cgroup(str(parent), "scalebox-1-1", lim)
    # the memory controller was enabled for the children (a real kernel keeps the list itself)
    assert (parent / "cgroup.subtree_control").read_text() == "+memory"
    read = {name: (tmp_path / "cg" / "scalebox-1-1" / name).read_text() for name in ("memory.max", "memory.oom.group", "cpu.max", "cpu.weight")}
    assert read == {"memory.max": str(300 << 20), "memory.oom.group": "1", "cpu.max": "150000 100000", "cpu.weight": "500"}
    (tmp_path / "cg" / "scalebox-1-1" / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    assert limits.oom_kills(path) == 1


def test_an_oom_kill_in_the_cgroup_names_the_limit(tmp_path):
    enforcement = limits.Enforcement(limits.Limits(), "x")
    enforcement.limits = limits.Limits(memory=4 << 30)
    enforcement.cgroup = str(tmp_path)
    (tmp_path / "memory.events").write_text("oom 1\noom_kill 1\n")
    assert enforcement.cause(-9, []) == "memory limit 4g reached"
    assert enforcement.cause(0, []) is None
    (tmp_path / "memory.events").write_text("oom 0\noom_kill 0\n")
    fresh = limits.Enforcement(limits.Limits(), "x")
    fresh.limits, fresh.cgroup = limits.Limits(memory=4 << 30), str(tmp_path)
    assert fresh.cause(-9, ["Killed"]) is None


def test_device_memory_caps_each_device_in_the_child(monkeypatch):
    from scalebox_cst.runtime import limits as child

    calls = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 2,
        get_device_properties=lambda d: types.SimpleNamespace(total_memory=64 << 30),
        set_per_process_memory_fraction=lambda f, d: calls.append((f, d)),
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(child.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv(child.ENV_DEVICE_MEMORY, str(16 << 30))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert child.apply() == [("cuda", 0, 0.25), ("cuda", 1, 0.25)] and calls == [(0.25, 0), (0.25, 1)]
    monkeypatch.setenv("LOCAL_RANK", "1")  # a torchrun rank caps its own device
    assert child.apply() == [("cuda", 1, 0.25)]


@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_device_memory_limit_ends_the_run_naming_it(probe_project):
    (probe_project / "gpu.py").write_text("import torch\nx = torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\n")
    scalebox("rewrite", str(probe_project))
    proc = scalebox("run", "--device-memory", "1g", "gpu.py", cwd=probe_project, check=False)
    assert proc.returncode != 0
    assert _only_run(probe_project)["stop_reason"] == "device memory limit 1g reached", proc.stderr


def test_limits_pass_through_torchrun_to_every_rank(probe_project):
    pytest.importorskip("torch.distributed.run")
    proc = scalebox("run", "--nproc", "2", "--memory", "1g", "--priority", "low", "probe.py", cwd=probe_project, timeout=240)
    seen = _probes(proc.stdout.replace("[rank0]:", "").replace("[rank1]:", ""))
    assert sorted(s["rank"] for s in seen) == ["0", "1"], proc.stdout
    record = _only_run(probe_project)
    for s in seen:
        assert s["nice"] == limits.NICE["low"]
        if "RLIMIT_DATA" in record["limits"]["memory"]:
            assert s["data"] == 1 << 30


def test_ray_jobs_carry_the_limits(probe_project, monkeypatch):
    """A Ray task's tree has no scalebox.toml: the driver's limits travel in the job, and the
    task's executor reads them (checked without starting Ray: the task body is a plain generator)."""
    from scalebox_cst import raylaunch

    (probe_project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n[run]\nmemory = "1g"\n')
    monkeypatch.setenv(limits.ENV, json.dumps({"priority": "low"}))
    seen = {}
    monkeypatch.setattr(raylaunch, "run_ray", lambda root, store, jobs, **kw: seen.setdefault("jobs", jobs) and [])
    info = types.SimpleNamespace(name="run/0001", commit="c" * 40, source_commit="s" * 40)
    raylaunch.cli_run(str(probe_project), "store", [info], "probe.py", [], [None], lambda c: None, lambda b: None,
                      "rewrite", None, None, lambda text: None, lambda record: "")
    [job] = seen["jobs"]
    assert job.limits == {"memory": 1 << 30, "priority": "low"}
    assert limits.resolve(str(probe_project / "nowhere"), {limits.ENV: json.dumps(job.limits)}) == limits.Limits(memory=1 << 30, priority="low")
