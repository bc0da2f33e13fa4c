"""One run on several processes: a committed branch under torchrun (gloo on CPU).

Every rank must run the commit (the rewrite, project modules from the store, not the files on
disk), DDP must work across the ranks (their gradients agree after the all-reduce although each
saw its own data), each rank's output and metrics must land in the run folder by rank, a failing
rank must fail the run with its own traceback, and a run stopped or killed mid-way must leave no
process behind.
"""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from scalebox_cst import runs
from scalebox_cst.project import Project
from scalebox_cst.runner.torchrun import TorchrunExecution, failed_first_line, first_failure, split_prefixed, torchrun_command

from conftest import scalebox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="torchrun workers and process groups as on Linux")

DDP_SCRIPT = textwrap.dedent(
    """\
    import argparse
    import json
    import os
    import subprocess
    import sys
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import helpers

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)  # each rank its own data
    for step in range(args.steps):
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step={step} loss={loss.item():.6f}")
        if rank == args.fail_rank and step == 1:
            raise ValueError(f"rank {rank} breaks here")
    if args.sleep:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.path.join(os.environ["SCALEBOX_RUN_DIR"], f"child{rank}.pid"), "w") as fh:
            fh.write(str(child.pid))
        print("sleeping", flush=True)
        time.sleep(args.sleep)
    grads = [p.grad.flatten().tolist() for p in model.parameters()]
    rewritten = any(name.startswith("_scalebox_") for name in globals())
    print("result", json.dumps({"rank": rank, "rewritten": rewritten, "mark": helpers.MARK, "grads": grads, "loss": loss.item()}))
    dist.destroy_process_group()
    """
)


@pytest.fixture
def ddp_project(project):
    """A DDP script committed to run/0001 (grad_clip inserts a `_scalebox_` helper: the marker
    of the rewrite), then its helper module changed on disk."""
    (project / "train.py").write_text(DDP_SCRIPT)
    (project / "helpers.py").write_text("MARK = 'committed'\n")
    (project / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    report = json.loads(scalebox("rewrite", str(project), "--json").stdout)
    assert report["branch"] == "run/0001"
    assert [f["status"] for f in report["files"] if f["path"] == "train.py"] == ["rewritten"], report
    (project / "helpers.py").write_text("MARK = 'disk'\n")
    return project


def _execution(root, args, nproc=2, **kwargs):
    project = Project(str(root))
    info = project.store.resolve("run/0001")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return TorchrunExecution(
        project.store.path, project.root, project.runs_dir, info.name, info.commit, "train.py", args,
        source_commit=info.source_commit, nproc=nproc, env=env, tensorboard=False, **kwargs,
    )


def _results(run_dir, nproc):
    out = {}
    for rank in range(nproc):
        with open(os.path.join(run_dir, "ranks", str(rank), "log.txt"), encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("result "):
                    out[rank] = json.loads(line[len("result "):])
    return out


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except OSError:
        return True


def _wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_two_ranks_run_the_rewrite_and_their_gradients_agree(ddp_project):
    execution = _execution(ddp_project, ["--steps", "3"])
    record = execution.wait(timeout=240)
    log = open(os.path.join(execution.dir, "log.txt"), encoding="utf-8").read()
    assert record.status == "ok", log
    results = _results(execution.dir, 2)
    assert sorted(results) == [0, 1], log
    for rank, result in results.items():
        assert result["rewritten"] is True and result["mark"] == "committed", result
    assert results[0]["grads"] == results[1]["grads"]  # all-reduced: the same on every rank, bitwise
    assert results[0]["loss"] != results[1]["loss"]  # ... although each rank saw its own data
    saved = runs.load_record(execution.dir)
    assert saved["launcher"] == "torchrun" and saved["nproc"] == 2 and saved["status"] == "ok"
    assert [r["rank"] for r in saved["ranks"]] == [0, 1] and not any(r["failed"] for r in saved["ranks"])
    assert saved["primary"] is True
    # each rank's key=value lines are its own metrics: rank 0's are the run's, rank 1's in ranks/1/
    losses0 = [p for p in runs.read_metrics(os.path.join(execution.dir, "metrics.jsonl"))[0] if p.name == "loss"]
    losses1 = [p for p in runs.read_metrics(os.path.join(execution.dir, "ranks", "1", "metrics.jsonl"))[0] if p.name == "loss"]
    assert [p.step for p in losses0] == [0, 1, 2] and [p.step for p in losses1] == [0, 1, 2]
    assert losses0[-1].value == pytest.approx(results[0]["loss"], abs=1e-5)
    assert losses1[-1].value == pytest.approx(results[1]["loss"], abs=1e-5)
    assert {split_prefixed(line)[0] for line in log.splitlines() if line.startswith("[rank")} == {0, 1}


def test_a_failing_rank_fails_the_run_with_its_traceback(ddp_project):
    execution = _execution(ddp_project, ["--steps", "3", "--fail-rank", "1"])
    record = execution.wait(timeout=240)
    assert record.status == "failed" and record.exit_status != 0
    tail = record.error_tail
    assert tail[0] == "rank 1 failed first: ValueError: rank 1 breaks here", tail
    assert any(line.startswith("Traceback (most recent call last)") for line in tail), tail
    assert any('raise ValueError(f"rank {rank} breaks here")' in line for line in tail), tail
    # the user's file and line (the rewrite added lines above it)
    line_no = DDP_SCRIPT.splitlines().index('        raise ValueError(f"rank {rank} breaks here")') + 1
    assert any(f'train.py", line {line_no}' in line for line in tail), tail
    saved = runs.load_record(execution.dir)
    assert saved["status"] == "failed" and saved["error_tail"] == tail
    assert [r["rank"] for r in saved["ranks"] if r["error"] and r["error"].startswith("ValueError")] == [1]


def test_the_first_failure_is_named_per_node_across_nodes():
    """One node sees only its ranks: across nodes its record says which rank failed first *on this
    node* (a rank on another node may have failed earlier); on one node, first of the run."""
    ranks = [
        {"rank": 2, "failure": {"error": "RuntimeError: peer closed", "time": 12.5}},
        {"rank": 3, "failure": {"error": "ValueError: bad batch", "time": 11.0}},
        {"rank": 4, "failure": None},
    ]
    failed = first_failure(ranks)
    assert failed is not None and failed["rank"] == 3
    assert failed_first_line(failed, "1") == "rank 3 failed first: ValueError: bad batch"
    assert failed_first_line(failed, "1:1") == "rank 3 failed first: ValueError: bad batch"
    for nnodes in ("2", "1:4"):
        assert failed_first_line(failed, nnodes) == "rank 3 failed first on this node: ValueError: bad batch"
    assert first_failure([{"rank": 0, "failure": None}]) is None


def _pids(run_dir, nproc):
    pids = []
    for rank in range(nproc):
        with open(os.path.join(run_dir, "ranks", str(rank), "rank.json"), encoding="utf-8") as fh:
            pids.append(json.load(fh)["pid"])
        with open(os.path.join(run_dir, f"child{rank}.pid") if rank == 0 else os.path.join(run_dir, "ranks", str(rank), f"child{rank}.pid"), encoding="utf-8") as fh:
            pids.append(int(fh.read()))
    return pids


def _children_started(run_dir, nproc):
    paths = [os.path.join(run_dir, "child0.pid")] + [os.path.join(run_dir, "ranks", str(k), f"child{k}.pid") for k in range(1, nproc)]
    return all(os.path.exists(p) and os.path.getsize(p) for p in paths)


def _start_cli(root, *args):
    """`scalebox run --nproc 2 ...` as a user starts it, and its run folder."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from scalebox_cst.cli import main; main()", "run", "--nproc", "2", "run/0001", "train.py", "--", *args],
        cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True,
    )
    return proc, os.path.join(str(root), ".scalebox", "runs", "run", "0001", "0001")


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_run_killed_mid_way_leaves_no_process_behind(ddp_project, how):
    """SIGTERM to `scalebox run`: it stops torchrun, which stops its ranks (and their children),
    and records the run stopped, with no traceback of torchrun's agent on the terminal. SIGKILL: torchrun sees its parent gone and stops its workers;
    a worker whose torchrun is gone stops its own process group."""
    driver, run_dir = _start_cli(ddp_project, "--steps", "2", "--sleep", "300")
    try:
        _wait_for(lambda: _children_started(run_dir, 2), 180, "both ranks to start their children")
        with open(os.path.join(run_dir, "record.json"), encoding="utf-8") as fh:
            torchrun_pid = json.load(fh)["pid"]
        pids = [torchrun_pid, *_pids(run_dir, 2)]
        assert not any(_gone(p) for p in pids)
        os.kill(driver.pid, getattr(signal, how))
        code = driver.wait(timeout=60)
        _wait_for(lambda: all(_gone(p) for p in pids), 40, f"processes {pids} to end")
        if how == "SIGTERM":
            said = driver.stderr.read()
            assert code == 128 + signal.SIGTERM, said
            assert runs.load_record(run_dir)["status"] == "stopped"
            # the stop is told once by scalebox; torchrun's agent raised SignalException with a traceback
            assert "Traceback" not in said and "SignalException" not in said, said
        else:
            assert runs.load_record(run_dir)["status"] == "lost"  # nobody left to finish the record
    finally:
        if driver.poll() is None:
            driver.kill()


@contextlib.contextmanager
def _reserved_port():
    """A loopback port no other process gets while the test runs: the socket holding it is bound
    with SO_REUSEADDR and never listens, so the rendezvous store (which binds with SO_REUSEADDR too)
    can still listen on it. A port merely found free and closed could be handed to a socket of a
    test running beside this one before the first node binds it (both nodes would then dial a
    stranger)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _descendants(pid):
    """``pid`` and every process below it (torchrun's workers start their own sessions, so a
    process group does not reach them)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo.extend(children.get(out[-1], ()))
    return out


def _node_report(nodes):
    """Each node's record (status, exit, signal, error tail) and its files: the console
    (``log.txt``), torchrun's own messages (``stderr.txt``, where an agent's failure is told) and
    every rank's log, so that a failure names its cause."""
    report = []
    for node in nodes:
        with contextlib.suppress(Exception):
            rec = runs.load_record(node.dir)
            report.append(f"--- {node.dir}: status={rec.get('status')} exit={rec.get('exit_status')} "
                          f"signal={rec.get('signal')} error_tail={rec.get('error_tail')}")
        names = ["log.txt", "stderr.txt"]
        for root, _, files in os.walk(os.path.join(node.dir, "ranks")):
            names += [os.path.relpath(os.path.join(root, f), node.dir) for f in files if f in ("log.txt", "failure.json")]
        for name in names:
            with contextlib.suppress(OSError), open(os.path.join(node.dir, name), encoding="utf-8", errors="replace") as fh:
                report.append(f"--- {node.dir}/{name}\n{fh.read()[-12000:]}")
    return "\n".join(report)


def _wait_or_explain(nodes, timeout):
    """The nodes' records; on a hang, every process of every node prints its Python stacks
    (faulthandler on SIGABRT) and the test fails with each node's output and stacks."""
    deadline = time.monotonic() + timeout
    try:
        return [node.wait(timeout=max(1.0, deadline - time.monotonic())) for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            for pid in _descendants(node.proc.pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGABRT)
        time.sleep(3)
        for node in nodes:
            with contextlib.suppress(Exception):
                node.stop(grace=1.0)
        pytest.fail(f"the nodes did not end in {timeout} s:\n" + _node_report(nodes), pytrace=False)


def test_two_nodes_meet_at_a_rendezvous_endpoint(ddp_project, monkeypatch):
    """Two `scalebox run --nproc 1 --nnodes 2 --rdzv-endpoint` (two "nodes" on one machine): one
    group of two ranks, each node recording its own rank as its own run."""
    monkeypatch.setenv("PYTHONFAULTHANDLER", "1")  # stacks on SIGABRT if it ever hangs
    with _reserved_port() as port:
        endpoint = f"127.0.0.1:{port}"
        nodes = [_execution(ddp_project, ["--steps", "3"], nproc=1, nnodes="2", rdzv_endpoint=endpoint, rdzv_id="t") for _ in range(2)]
        records = _wait_or_explain(nodes, 240)
    if [r.status for r in records] != ["ok", "ok"]:
        pytest.fail("a node failed:\n" + _node_report(nodes), pytrace=False)
    ranks = sorted(r["rank"] for n in nodes for r in runs.load_record(n.dir)["ranks"])
    assert ranks == [0, 1]
    assert sorted(runs.load_record(n.dir)["primary"] for n in nodes) == [False, True]  # rank 0's node holds the run
    results = {}
    for node in nodes:
        (rank,) = [r["rank"] for r in runs.load_record(node.dir)["ranks"]]
        with open(os.path.join(node.dir, "ranks", str(rank), "log.txt"), encoding="utf-8") as fh:
            results[rank] = next(json.loads(line[7:]) for line in fh if line.startswith("result "))
    assert results[0]["grads"] == results[1]["grads"] and results[0]["mark"] == results[1]["mark"] == "committed"


def test_options_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        torchrun_command(sys.executable, str(tmp_path), 2, nnodes="2")
    with pytest.raises(ValueError, match="at least 1"):
        torchrun_command(sys.executable, str(tmp_path), 0)
    multi = torchrun_command(sys.executable, str(tmp_path), 4, nnodes="2", rdzv_endpoint="head:29500")
    assert "--standalone" not in multi and multi[multi.index("--rdzv-endpoint") + 1] == "head:29500"
    assert multi[multi.index("--rdzv-id") + 1] == "scalebox-head:29500"
    assert torchrun_command(sys.executable, str(tmp_path), 2)[-2:] == ["--module", "scalebox_cst.runtime.distributed"]


def test_the_cli_refuses_a_mix_of_launcher_options_in_one_line(ddp_project):
    for args, message in (
        (["--nproc", "2", "--address", "auto"], "scalebox: --address: options of --launcher ray"),
        (["--nproc", "2", "--nnodes", "2"], "scalebox: --nnodes above 1 needs --rdzv-endpoint HOST:PORT (the same on every node)"),
        (["--launcher", "ray", "--nproc", "2"], "scalebox: --nproc: torchrun options (use --nproc N, not --launcher ray)"),
    ):
        proc = scalebox("run", *args, "run/0001", "train.py", cwd=ddp_project, check=False)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [message], proc.stderr
    assert runs.list_runs(str(ddp_project)) == []


def test_a_rank_log_path_outside_the_run_folder_is_not_read(tmp_path):
    """A rank's ``rank.json`` is written in the training process; its ``log`` path goes into the
    record's error tail, which the monitor serves. Only files inside the run folder are read."""
    from scalebox_cst.runner.torchrun import rank_log_lines

    run_dir = tmp_path / "run"
    (run_dir / "ranks" / "0").mkdir(parents=True)
    (run_dir / "ranks" / "0" / "log.txt").write_text("Traceback (most recent call last):\nValueError: x\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("password\n")
    assert rank_log_lines(str(run_dir), {"log": "ranks/0/log.txt"})[-1] == "ValueError: x\n"
    for log in ("../secret.txt", str(secret), "ranks/../../secret.txt", 7, ["x"]):
        assert rank_log_lines(str(run_dir), {"log": log}) == [], log
    (run_dir / "ranks" / "0" / "out.txt").symlink_to(secret)
    assert rank_log_lines(str(run_dir), {"log": "ranks/0/out.txt"}) == []
