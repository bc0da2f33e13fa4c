"""The hot.* family: rewrites aimed at where whole training runs spend their time (issue 21).

Each is ``exact``: :mod:`.distributions` (distributions built every step without argument
validation where the arguments are valid by construction) and :mod:`.arrays` (tensors from lists
of numpy arrays built from one ``np.array`` copy, guarded at run time).
"""
