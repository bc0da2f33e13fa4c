"""What spawn and forkserver children of a scalebox process run as their ``__mp_main__``.

multiprocessing re-creates the parent's main module in such children from its ``__spec__.name``;
the scripts that ``python -m scalebox_cst SCRIPT`` (the import hook) and ``scalebox run`` (the
executor, ``runtime/launch.py``) start name this module, which runs the script's committed
rewrite with the parent's settings, so workers run what the parent runs. Which of the two: the
executor removes the hook's variable when it starts a run, so the hook's being set means a hook
run started inside (after) any executor run, and it wins.
"""


def _main(namespace: dict) -> None:
    import os

    from scalebox_cst.importhook.common import ENV_MAIN
    from scalebox_cst.importhook.install import _run_spawned_main
    from scalebox_cst.runtime.launch import ENV_RUN, run_spawned_main

    del namespace["_main"]  # the script's namespace holds only what the script defines
    if os.environ.get(ENV_RUN) and not os.environ.get(ENV_MAIN):
        run_spawned_main(namespace)
    else:
        _run_spawned_main(namespace)


if __name__ == "__mp_main__":
    _main(globals())
