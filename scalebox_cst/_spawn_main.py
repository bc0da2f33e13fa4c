"""What spawn children of ``python -m scalebox_cst SCRIPT`` run as their ``__mp_main__``.

multiprocessing re-creates the parent's main module in spawn and forkserver children from its
``__spec__.name``; the script's spec names this module, which installs the import hook with the
parent's settings and runs the script's committed rewrite, so workers run what the parent runs.
"""
if __name__ == "__mp_main__":
    from scalebox_cst.importhook import _run_spawned_main

    _run_spawned_main(globals())
