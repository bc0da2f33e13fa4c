"""Runtime support for rewritten code: backends, executor, vectorized ops, metrics.

Rewritten code imports helpers from here by their full names (``scalebox_cst.runtime.<module>``);
this package never imports the transforms. Importing it is cheap: submodules load on demand.
"""
