"""The vectorize.* family: Python loops over time or over parameters rewritten as tensor code,
each behind a run-time guard with the original loop kept verbatim as the fallback.

:mod:`.recurrence` (backward linear recurrences: GAE, discounted returns, their quadratic double
loops). Analysis that other families use too lives in :mod:`scalebox_cst.transforms.analysis`.
"""
