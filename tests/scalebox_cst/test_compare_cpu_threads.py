"""What compare's time numbers rest on: CPU time is no speed measurement either where runs with
several torch threads shared the machine, and sites too brief to be sampled are no measured 0 s.

On a host loaded 5 to 12 on 2 CPUs, seeded runs of quantumiracle's dqn.py doing identical work
(same returns, original and exact rewrite) took 9.5 s and 15.7 s, 26.6 s and 15.9 s of CPU:
OpenMP's intra-op threads spin at each barrier while a sibling waits for a core, so compare's
"CPU time ... higher (worse)" (PPO-for-Beginners: +25%, [+0.5, +4.9]) judged the machine.
"""
import json
import os

from conftest import scalebox
from scalebox_cst import compare as stats
from scalebox_cst import runs


def _line(name, step, value):
    return json.dumps({"name": name, "step": step, "value": value, "time": 1.0}) + "\n"


def _fake_run(root, branch, started, cpu, threads, load, variant="rewrite"):
    number, folder = runs.allocate_run(str(root), branch)
    runs.write_record(folder, {"branch": branch, "run": number, "status": "ok", "variant": variant, "started": started,
                               "ended": started + 10.0, "wall_time": 10.0, "host": None,
                               "load": {"runnable_mean": load, "cpus": 2}})
    with open(os.path.join(folder, runs.METRICS), "w") as fh:
        fh.write(_line("scalebox/cpu_time_s", 2, cpu))
        if threads is not None:
            fh.write(_line("scalebox/intra_op_threads", 2, threads))
    return runs.RunInfo(branch, number, folder, runs.load_record(folder))


def _cpu_verdict(tmp_path, branch, threads, load):
    at = 10_000.0 * int(branch[-4:])  # one run at a time in the project: no overlap
    a = [_fake_run(tmp_path, branch, at + 100 * i, 10.0 + 0.1 * i, threads, load, variant="original") for i in range(3)]
    b = [_fake_run(tmp_path, branch, at + 1000 + 100 * i, 14.0 + 0.1 * i, threads, load) for i in range(3)]
    result = stats.compare([("original", a), (branch, b)])
    (cpu,) = [m for m in result["metrics"] if m["metric"] == "cpu_time_s"]
    return cpu["groups"][1]["vs_first"]


def test_cpu_time_of_multithreaded_runs_on_a_loaded_host_gets_no_better_or_worse(tmp_path):
    diff = _cpu_verdict(tmp_path, "run/0001", 2, 6.0)
    assert "(worse)" not in diff["text"] and diff["shared_machine"]
    assert "not a speed measurement either: 6 of 6 runs shared the machine with several torch threads" in diff["text"]
    assert "OMP_NUM_THREADS=1" in diff["text"]
    # one intra-op thread (or runs that did not say: older records), or a quiet host: the verdict stands
    for branch, threads, load in (("run/0002", 1, 6.0), ("run/0003", None, 6.0), ("run/0004", 2, 0.5)):
        assert _cpu_verdict(tmp_path, branch, threads, load)["text"] == "higher (worse)", branch


def test_a_run_records_the_intra_op_threads_its_script_set(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "t.py").write_text("import torch\n\ntorch.set_num_threads(3)\nprint(float(torch.ones(4).sum()))\n")
    (root / "scalebox.toml").write_text('backend = "cpu"\ntransforms = ["grad_clip"]\n')
    scalebox("init", str(root))
    scalebox("run", "t.py", cwd=root)  # OMP_NUM_THREADS=1 in the environment: the script's 3 is read
    (run,) = runs.list_runs(str(root))
    assert runs.read_series(run.dir)["scalebox/intra_op_threads"][-1].value == 3


def test_sites_below_sampling_are_not_compared_as_zero_seconds(tmp_path):
    """``make demo``'s compare printed "time in rewritten sites (s) ... 0 [0, 0] (n=2)" where
    ``scalebox log`` said "sites below sampling": sites too brief for the sampler are no measured 0 s."""
    group = []
    for i, samples in enumerate((0, 0, 3)):
        run = _fake_run(tmp_path, "run/0001", 1000.0 + 100 * i, 9.0, 1, 0.5)
        with open(os.path.join(run.dir, runs.SITES), "w") as fh:
            json.dump({"sites": [{"path": "t.py", "line": 3, "transform": "grad_clip", "vectorized": 10, "fallback": 0,
                                  "time_s": 0.5 if samples else 0.0, "samples": samples}]}, fh)
        group.append(run)
    text = stats.render(stats.compare([("a", group[:2]), ("b", group)]))
    block = text.split("time in rewritten sites (s)\n")[1].split("\n\n")[0].splitlines()
    assert block[0].split() == ["a", "below", "sampling", "in", "2", "run(s):", "the", "sites", "ran", "too", "briefly", "to", "be", "seen"]
    assert block[1].startswith("  b ") and "0.5  (n=1; 2 below sampling)" in block[1] and " 0 [" not in text


def test_groups_run_with_other_thread_counts_get_no_speed_verdict(tmp_path):
    """Originals run with torch's 2 threads, the rewrite with OMP_NUM_THREADS=1, on a quiet host:
    compare called the rewrite's CPU time -56% "lower (better)"; that compared the settings."""
    a = [_fake_run(tmp_path, "run/0001", 1000.0 + 100 * i, 8.0 + 0.1 * i, 2, 0.5, variant="original") for i in range(3)]
    b = [_fake_run(tmp_path, "run/0001", 2000.0 + 100 * i, 3.5 + 0.1 * i, 1, 0.5) for i in range(3)]
    (cpu,) = [m for m in stats.compare([("original", a), ("run/0001", b)])["metrics"] if m["metric"] == "cpu_time_s"]
    diff = cpu["groups"][1]["vs_first"]
    assert "(better)" not in diff["text"] and diff["threads_differ"]
    assert "the runs had other torch thread counts (original: 2; run/0001: 1)" in diff["text"]
    c = [_fake_run(tmp_path, "run/0002", 5000.0 + 100 * i, 3.5 + 0.1 * i, 2, 0.5) for i in range(3)]
    (cpu,) = [m for m in stats.compare([("original", a), ("c", c)])["metrics"] if m["metric"] == "cpu_time_s"]
    assert cpu["groups"][1]["vs_first"]["text"] == "lower (better)"  # same settings: the verdict stands


def test_groups_run_with_other_script_arguments_get_no_verdict_and_say_so(tmp_path):
    """A newcomer's Lizhi-sjtu PPO-discrete: `scalebox run --seeds 0 ... -- --max_train_steps 6000`
    and a watcher's run of the same branch with `--max_train_steps 3000` made one group, and compare
    read the rewrite's return as -30% against the original's of 6000 steps (same seed, same args:
    identical)."""
    def with_args(run, args, ret):
        record = runs.load_record(run.dir)
        record["args"] = args
        runs.write_record(run.dir, record)
        with open(os.path.join(run.dir, runs.METRICS), "a") as fh:
            for i in range(10):
                fh.write(_line("scalebox/episodic_return", i, ret))
        return runs.RunInfo(run.branch, run.run, run.dir, runs.load_record(run.dir))

    long, short = ["--max_train_steps", "6000"], ["--max_train_steps", "3000"]
    a = [with_args(_fake_run(tmp_path, "run/0001", 100.0, 10.0, 1, 0.5, variant="original"), long, 190.0)]
    b = [with_args(_fake_run(tmp_path, "run/0001", 200.0 + 100 * i, 10.0, 1, 0.5), args, ret)
         for i, (args, ret) in enumerate(((long, 190.0), (short, 76.0)))]
    result = stats.compare([("original", a), ("run/0001", b)])
    (ret,) = [m for m in result["metrics"] if m["metric"] == "episodic_return"]
    diff = ret["groups"][1]["vs_first"]
    assert diff["args_differ"] and "(worse)" not in diff["text"]
    assert ("the runs had other script arguments (original: --max_train_steps 6000; "
            "run/0001: --max_train_steps 3000 | --max_train_steps 6000): this compares those arguments too") in diff["text"]
    # the same arguments on both sides: nothing said
    same = stats.compare([("original", a), ("run/0001", b[:1])])
    (ret,) = [m for m in same["metrics"] if m["metric"] == "episodic_return"]
    assert "args_differ" not in ret["groups"][1]["vs_first"] and "script arguments" not in ret["groups"][1]["vs_first"]["text"]


def test_a_group_header_counts_its_runs_no_seed_was_given(tmp_path):
    """The same walkthrough's header read "run/0002: 2 run(s) run/0002#2, run/0002#3 (seeds 0)"
    where #3 was the watcher's, seeded by nothing: two returns 76 and 190 under "seeds 0" read as
    a rewrite that is not deterministic."""
    seeded = _fake_run(tmp_path, "run/0001", 100.0, 10.0, 1, 0.5)
    record = runs.load_record(seeded.dir)
    record["seed"] = 0
    runs.write_record(seeded.dir, record)
    seeded = runs.RunInfo(seeded.branch, seeded.run, seeded.dir, runs.load_record(seeded.dir))
    watched = _fake_run(tmp_path, "run/0001", 200.0, 10.0, 1, 0.5)
    text = stats.render(stats.compare([("a", [seeded]), ("b", [seeded, watched]), ("c", [watched])]))
    assert "a: 1 run(s) run/0001#1 (seeds 0)\n" in text
    assert "b: 2 run(s) run/0001#1, run/0001#2 (seeds 0; 1 not seeded by scalebox)\n" in text
    assert "c: 1 run(s) run/0001#2 (1 not seeded by scalebox)\n" in text


def test_a_group_without_runs_is_one_line_saying_how_to_make_one(tmp_path):
    """`compare original run/0001` before any `--original` run printed the original's row as "-"
    under every metric, a page of dashes (the newcomer's walkthrough): its header now says there
    is nothing to compare and how to make a run, and its rows are left out."""
    done = [_fake_run(tmp_path, "run/0001", 100.0 * i, 10.0, 1, 0.5) for i in range(2)]
    failed = _fake_run(tmp_path, "run/0002", 900.0, 10.0, 1, 0.5)
    record = dict(failed.record, status="failed")
    runs.write_record(failed.dir, record)
    failed = runs.RunInfo(failed.branch, failed.run, failed.dir, record)
    text = stats.render(stats.compare([("original (run/0001)", []), ("run/0001", done), ("run/0002", [failed])]))
    assert "original (run/0001): 0 run(s); nothing to compare: `scalebox run --original SCRIPT` makes a run of it\n" in text
    assert "run/0002: 0 run(s); left out: run/0002#1 (failed); nothing to compare: `scalebox run SCRIPT` makes a run of it\n" in text
    rows = [line for line in text.splitlines() if line.startswith("  ")]
    assert rows and all(line.lstrip().startswith("run/0001 ") for line in rows), text


def test_runs_launched_by_other_builds_of_the_engine_are_said_to_be(tmp_path):
    """The original's runs pool every snapshot of the same files, made with whatever build of
    the engine was installed then (runs from before the launcher seeded numpy beside runs after
    it): compare names the builds where the runs it compares came from more than one, and a
    record that says none is an earlier build."""
    def built(run, build):
        record = runs.load_record(run.dir)
        if build is not None:
            record["engine"] = build
        runs.write_record(run.dir, record)
        return runs.RunInfo(run.branch, run.run, run.dir, runs.load_record(run.dir))

    a = [built(_fake_run(tmp_path, "run/0001", 100.0 * i, 10.0, 1, 0.5, variant="original"), build)
         for i, build in enumerate(("0.1.0+aaaaaaaa", None))]
    b = [built(_fake_run(tmp_path, "run/0001", 1000.0 + 100 * i, 10.0, 1, 0.5), "0.1.0+bbbbbbbb") for i in range(2)]
    result = stats.compare([("original", a), ("run/0001", b)])
    assert result["builds"] == {"0.1.0+aaaaaaaa": [a[0].id], stats.UNRECORDED_BUILD: [a[1].id],
                                "0.1.0+bbbbbbbb": [r.id for r in b]}
    text = stats.render(result)
    assert "runs made by 3 builds of scalebox (0.1.0+aaaaaaaa: run/0001#1; an earlier build (not recorded): run/0001#2;" in text
    one = stats.compare([("original", a[:1]), ("run/0001", [built(b[0], "0.1.0+aaaaaaaa")])])
    assert one["builds"] is None and "builds of scalebox" not in stats.render(one)


def test_a_run_records_the_build_that_launched_it(tmp_path):
    from scalebox_cst.runner.record import RunRecord, engine_build

    record = RunRecord("run/0001", "c" * 40, "train.py", [], started=1.0)
    assert record.engine == engine_build() and "+" in record.engine
    assert RunRecord.from_json({"branch": "run/0001", "commit": "c" * 40, "script": "t.py", "args": [], "started": 1.0}).engine is None


def _seeded(run, args, seed, ret, cpu=None):
    """``run`` as `scalebox run --seeds` makes it for a script with a --seed option: the seed is
    appended to its arguments (seed_via "option")."""
    record = runs.load_record(run.dir)
    record.update(args=[*args, "--seed", str(seed)], seed=seed, seed_via="option")
    runs.write_record(run.dir, record)
    with open(os.path.join(run.dir, runs.METRICS), "a") as fh:
        for i in range(10):
            fh.write(_line("scalebox/episodic_return", i, ret + seed))
    return runs.RunInfo(run.branch, run.run, run.dir, runs.load_record(run.dir))


def test_the_seed_the_launcher_appended_is_no_other_script_argument(tmp_path):
    """Original run with --seeds 0,1 and the rewrite with --seeds 0,1,2 (same script arguments):
    the appended `--seed 2` read as "the runs had other script arguments" and withheld the verdict."""
    ep = ["--episodes", "80"]
    a = [_seeded(_fake_run(tmp_path, "run/0001", 100.0 * s, 10.0, 1, 0.5, variant="original"), ep, s, 20.0) for s in (0, 1)]
    b = [_seeded(_fake_run(tmp_path, "run/0001", 1000.0 + 100 * s, 5.0, 1, 0.5), ep, s, 20.0) for s in (0, 1, 2)]
    result = stats.compare([("original", a), ("run/0001", b)])
    for m in result["metrics"]:
        for row in m["groups"][1:]:
            assert "args_differ" not in row["vs_first"] and "script arguments" not in row["vs_first"]["text"], m
    (cpu,) = [m for m in result["metrics"] if m["metric"] == "cpu_time_s"]
    assert cpu["groups"][1]["vs_first"]["text"] == "lower (better)"


def test_a_group_of_runs_with_several_script_arguments_gets_no_verdict_and_says_so(tmp_path):
    """BY571's CQL-DQN run with `-- --episodes 15` and later `-- --episodes 80`, original and
    rewrite alike: `compare original run/0001` took each side's mean over both lengths ("steps/s
    2368 [149.6, 5543.3]") and judged it; with more short runs on one side that reads as a speed-up."""
    short, long = ["--episodes", "15"], ["--episodes", "80"]
    a = [_seeded(_fake_run(tmp_path, "run/0001", 100.0 * i, cpu, 1, 0.5, variant="original"), args, 0, 20.0)
         for i, (args, cpu) in enumerate(((short, 3.0), (long, 7.0)))]
    b = [_seeded(_fake_run(tmp_path, "run/0001", 1000.0 + 100 * i, cpu, 1, 0.5), args, 0, 20.0)
         for i, (args, cpu) in enumerate(((short, 3.0), (short, 3.1), (short, 3.0), (long, 7.0)))]
    result = stats.compare([("original", a), ("run/0001", b)])
    (cpu,) = [m for m in result["metrics"] if m["metric"] == "cpu_time_s"]
    diff = cpu["groups"][1]["vs_first"]
    assert diff["args_differ"] and "(better)" not in diff["text"]
    text = stats.render(result)
    assert ("  its runs had several script arguments (--episodes 15 | --episodes 80): each mean mixes them; "
            "compare the runs of one list: --args '...'") in text
    # --args '--episodes 80': one list a side, and a verdict again
    only = stats.with_args([("original", a), ("run/0001", b)], "--episodes 80")
    assert [[r.id for r in g] for _, g in only] == [[a[1].id], [b[3].id]]
    (cpu,) = [m for m in stats.compare(only)["metrics"] if m["metric"] == "cpu_time_s"]
    assert "script arguments" not in cpu["groups"][1]["vs_first"]["text"]
    assert "the runs of each side had several script arguments (--episodes 15 | --episodes 80): the means mix them" in diff["text"]
    c = b[:3]  # short runs only against the mix: other lists, said as such
    (cpu,) = [m for m in stats.compare([("original", a), ("c", c)])["metrics"] if m["metric"] == "cpu_time_s"]
    assert "(better)" not in cpu["groups"][1]["vs_first"]["text"]
    assert "other script arguments (original: --episodes 15 | --episodes 80; c: --episodes 15)" in cpu["groups"][1]["vs_first"]["text"]


def test_a_group_that_seeds_itself_is_one_sample_though_some_runs_have_no_return(tmp_path):
    """sweetice's AC_CartPole (torch.manual_seed(1), env.reset(seed=1)): its first originals ran
    before the engine counted the episodes of `gym.make(...).unwrapped` and have no return; beside
    them, the later originals of seeds 0 and 1 (identical returns) were not named one sample."""
    ep = ["--episodes", "80"]
    old = [_fake_run(tmp_path, "run/0001", 100.0 * s, 10.0, 1, 0.5, variant="original") for s in (0, 1)]
    for run, s in zip(old, (0, 1)):
        record = dict(runs.load_record(run.dir), seed=s, seed_via="env")
        runs.write_record(run.dir, record)
    old = [runs.RunInfo(r.branch, r.run, r.dir, runs.load_record(r.dir)) for r in old]
    new = [_seeded(_fake_run(tmp_path, "run/0001", 1000.0 + 100 * s, 10.0, 1, 0.5, variant="original"), ep, s, 20.0 - s)
           for s in (0, 1)]
    with open(os.path.join(new[1].dir, runs.METRICS), "w") as fh:  # seed 1 returned what seed 0 did
        fh.write(_line("scalebox/cpu_time_s", 2, 10.0) + _line("scalebox/intra_op_threads", 2, 1))
        for i in range(10):
            fh.write(_line("scalebox/episodic_return", i, 20.0))
    result = stats.compare([("original", old + new), ("run/0001", new)])
    assert result["groups"][0]["seed_blind"] == [0, 1]
