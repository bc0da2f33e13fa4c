"""The hot.* family: rewrites aimed at where a whole training run spends its time (see
``scalebox profile``), rather than at one loop.

Each is ``exact``: :mod:`.no_grad` (acting and logging forwards run under ``torch.no_grad()``),
:mod:`.distributions` (distributions built every step without argument validation where the
arguments are valid by construction) and :mod:`.arrays` (tensors from lists of numpy arrays built
from one ``np.array`` copy, guarded at run time) and :mod:`.fresh_device` (``make(x).to(device)`` of a
fresh tensor made by the legacy constructor's own steps, without its argument parsing, guarded
at run time) and :mod:`.target_cut` (a target
network used only for forwards is not run backward through: its output is cut from its graph,
guarded at run time by a mark on the object built at the proven site).
"""
