"""Run one training command and report its steady-state steps/s from its own prints.

CleanRL prints ``SPS: n`` (global_step / seconds since start) every `period` steps; the k-th such
line is at step k*period, so t_k = step_k / SPS_k and the steady rate over the second half of the
run is (s_last - s_mid) / (t_last - t_mid): compile time and start-up cancel out.  LeanRL prints
``speed: x sps`` (measured after its burn-in) in tqdm's line: the last one is taken.
"""
import json, re, subprocess, sys, time

name, period, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
offset, _, period = period.rpartition("+")
offset, period = int(offset or 0), int(period)  # "2000+100": first print at 2000+100
cmd = sys.argv[4:]
t0 = time.time()
try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    out, rc = p.stdout + "\n" + p.stderr, p.returncode
except subprocess.TimeoutExpired as e:
    out, rc = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace"), "timeout"
wall = time.time() - t0
sps = [int(m) for m in re.findall(r"^SPS:\s*(\d+)", out, re.M)]
speed = re.findall(r"speed:\s*([0-9.]+)\s*sps", out) or re.findall(r"([0-9.]+) sps,", out)
res = {"name": name, "rc": rc, "wall_s": round(wall, 1)}
if len(sps) >= 4:
    steps = [offset + (k + 1) * period for k in range(len(sps))]
    times = [s / max(v, 1) for s, v in zip(steps, sps)]
    mid = len(sps) // 2
    res["steady_sps"] = round((steps[-1] - steps[mid]) / max(times[-1] - times[mid], 1e-9), 1)
    res["final_SPS_print"] = sps[-1]
if speed:
    res["leanrl_speed_sps"] = float(speed[-1])
rets = re.findall(r"episodic_return=\[?([-0-9.e]+)", out)
if rets:
    res["last_returns"] = [float(r) for r in rets[-3:]]
if rc not in (0,):
    res["tail"] = out[-1500:]
print("RESULT " + json.dumps(res), flush=True)
