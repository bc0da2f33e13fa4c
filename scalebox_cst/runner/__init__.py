"""Supervising runs from the host: the engine side of ``scalebox run``, ``scalebox-watch --run``,
hot-fixes, torchrun and Ray. ``supervisor`` is the one entry (start, stop, replace, follow a
run; the stop signals); ``execution`` is one run's subprocess and folder, ``torchrun`` the same
under torch.distributed's launcher, ``record`` what ``record.json`` holds, ``signals`` the host's
SIGINT/SIGTERM/SIGHUP. What runs inside the user's process lives in ``scalebox_cst.runtime``."""
