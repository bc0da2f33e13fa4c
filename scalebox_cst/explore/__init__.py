"""``scalebox explore``: hyper-parameters tuned where they live in the code.

places (libcst: which literals are tunable, and writing a value into one), config (the study
file), branches (a trial is a committed branch; the one function that starts a run), study
(Optuna's ask/tell loop, pruning, resume), report (report.html, optimal_params.json, the
monitor's data), command (the CLI), raytrials (launcher: ray), monitor_api (the monitor's routes).
"""
