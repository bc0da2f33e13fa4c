#!/bin/bash
# Prepare issue 21's GPU check for the device machine (no network there; Python 3.12, torch with CUDA):
#   CLEANRL=<cleanrl git dir> LEANRL=<LeanRL git dir> bash benchmarks/gpu/prepare.sh   (repo root, .venv made)
#   then on the device, carrying .gpu:  BUDGET=510 bash benchmarks/gpu/run_gpu.sh
# .gpu/ (ignored through .git/info/exclude) gets the wheels the device lacks, CleanRL's scripts as
# written and rewritten with `scalebox rewrite --fast --backend cuda`, LeanRL's hand-made versions,
# and an offline stand-in for wandb. Versions that ran together on CPU here (2026-12-05): gymnasium
# 0.29.1 (CleanRL's wrappers predate gymnasium 1.0), mujoco 3.2.7, tensordict/torchrl 0.7.2 and
# numpy 1.26.4 for LeanRL (newer tensordict breaks its scripts; they need numpy < 2).
set -eu
R=$(pwd); G=$R/.gpu; mkdir -p $G/whl $G/whl_np1 $G/stubs/wandb
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
P="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
for p in gymnasium==0.29.1 farama-notifications mujoco==3.2.7 glfw pyopengl libcst pygit2 cffi pycparser watchdog tyro \
         docstring-parser typeguard shtab stable-baselines3 tensordict==0.7.2 torchrl==0.7.2 orjson; do
  python3 -m pip download -q --no-deps $P -d $G/whl "$p"
done
python3 -m pip download -q --no-deps $P -d $G/whl_np1 numpy==1.26.4
printf '%s\n' '"""Offline stand-in for wandb (no network on the device): every call is a no-op."""' \
  'def init(*a, **k): return None' 'def log(*a, **k): pass' 'def finish(*a, **k): pass' \
  'def __getattr__(name): return lambda *a, **k: None' > $G/stubs/wandb/__init__.py
: "${CLEANRL:?a git checkout or mirror of vwxyzjn/cleanrl}" "${LEANRL:?a git checkout or mirror of pytorch-labs/LeanRL}"
rm -rf $G/prep && .venv/bin/python benchmarks/fast_gpu_check.py prepare $G/prep --cleanrl $CLEANRL --leanrl $LEANRL
for f in ppo_continuous_action sac_continuous_action; do git -C $LEANRL show HEAD:leanrl/$f.py > $G/prep/leanrl/$f.py; done
du -sh $G
