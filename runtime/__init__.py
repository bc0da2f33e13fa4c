"""Runtime support for rewritten code, inside the user's process: backends, the commit loader and
launcher, vectorized ops and kernels, the stabilizer, metrics and telemetry.

Rewritten code imports helpers from here by their full names (``scalebox_cst.runtime.<module>``);
this package never imports the transforms, nor the host's modules that supervise a run
(``scalebox_cst.runner``): tests/test_layout.py lists the few leaf modules of the core it may
share. Importing it is cheap: submodules load on demand.
"""
