"""The hot.* family: rewrites aimed at where a whole training run spends its time (see
``scalebox profile``), rather than at one loop.

:mod:`.no_grad` (acting and logging forwards run under ``torch.no_grad()``).
"""
