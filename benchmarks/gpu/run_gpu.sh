#!/bin/bash
# The device half of issue 21's GPU check (prepare.sh makes .gpu/ here first); each result line starts with RESULT.
# One prepared device check (issue 21's GPU goal, then CUDA tests and the precision bench if time is left).
set -u
R=$(pwd); G=$R/.gpu;  # made by benchmarks/gpu/prepare.sh
 log=$OUT/gpu.log; T0=$(date +%s)
say() { echo "$*" | tee -a $log; }
left() { echo $(( ${BUDGET:-500} - ($(date +%s) - T0) )); }
say "start $(date +%T)"; nvidia-smi -L | tee -a $log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $G/whl/*.whl >>$log 2>&1 || say "wheel install failed"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/np1 $G/whl_np1/*.whl >>$log 2>&1 || say "numpy1 install failed"
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/engine $R >$OUT/engine_install.log 2>&1 || say "engine install failed"
export PYTHONPATH=/tmp/engine:/tmp/site:$G/stubs WANDB_MODE=disabled PYTHONUNBUFFERED=1
python3 -c "import torch, numpy, gymnasium, mujoco, scalebox_cst.runtime.compiled as c; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'numpy', numpy.__version__, 'gym', gymnasium.__version__)" 2>&1 | tail -2 | tee -a $log
say "installed after $(( $(date +%s) - T0 ))s"
M="python3 $R/benchmarks/gpu/measure.py"; ENV=${ENV_ID:-HalfCheetah-v4}; S0=${SAC_START:-2000}
PPO="--env-id $ENV --total-timesteps ${PPO_STEPS:-20480}"; LPPO="--env-id $ENV --total-timesteps 28672"
SAC="--env-id $ENV --total-timesteps ${SAC_STEPS:-5000} --learning-starts $S0"
run() { local t=$(left); [ $t -lt 40 ] && { say "skip $2: budget"; return; }; local lim=$(( $3 < t ? $3 : t )); local d=$1; shift 3; set -- "$1" "$2" "$lim" "${@:4}"; (cd $G/prep/$d; $M "$@") 2>&1 | tee -a $log; }
# run FOLDER NAME LIMIT  NAME PERIOD TIMEOUT CMD...
run original cleanrl_ppo 90 cleanrl_ppo_original 2048 90 python3 ppo_continuous_action.py $PPO
run fast fast_ppo 150 cleanrl_ppo_fast 2048 150 python3 ppo_continuous_action.py $PPO
run original cleanrl_sac 90 cleanrl_sac_original $S0+100 90 python3 sac_continuous_action.py $SAC
run fast fast_sac 150 cleanrl_sac_fast $S0+100 150 python3 sac_continuous_action.py $SAC
export PYTHONPATH=/tmp/np1:$PYTHONPATH
run leanrl leanrl_ppo 150 leanrl_ppo_compile_cudagraphs 2048 150 python3 ppo_continuous_action_torchcompile.py $LPPO --compile --cudagraphs
run leanrl leanrl_sac 150 leanrl_sac_compile_cudagraphs $S0+100 150 python3 sac_continuous_action_torchcompile.py $SAC --compile --cudagraphs
export PYTHONPATH=/tmp/engine:/tmp/site:$G/stubs
say "runs done after $(( $(date +%s) - T0 ))s"
if [ $(left) -gt 70 ]; then
  cd $R; timeout $(( $(left) - 40 )) python3 -m pytest -q -p no:cacheprovider -n 0 -k "cuda or CUDA or gpu or device_memory" tests/runtime/test_runtime_recurrence.py tests/runtime/test_stabilizer.py tests/transforms/vectorize/recurrence/test_vectorize_recurrence.py tests/transforms/accelerate/test_accelerate_compile.py tests/scalebox_cst/test_limits.py > $OUT/cuda_tests.log 2>&1; say "cuda tests rc=$? $(tail -1 $OUT/cuda_tests.log)"
fi
[ $(left) -gt 30 ] && (cd $R; timeout $(( $(left) - 5 )) python3 benchmarks/bench_precision.py --device cuda 2>&1 | tail -12 | tee -a $log)
say "end after $(( $(date +%s) - T0 ))s"
