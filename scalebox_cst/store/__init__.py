"""The rewrite store: a bare git repository at ``<project>/.scalebox/store.git``.

Every source snapshot and every rewrite is a commit, so what ran can always be shown, diffed and
restored with plain git. It is written with pygit2 plumbing only: no checkout, no working tree, and
the user's own ``.git``, index and files are never touched.

Layout (all inside the store)::

    refs/heads/source                      linear history of source snapshots
    refs/heads/run/NNNN                    one rewrite commit per run, parent = its snapshot
    refs/heads/hook/<session>              import hook: one commit per batch of modules, parent =
                                           the previous one (the first's: a snapshot)
    refs/notes/scalebox-reports            git note per rewrite commit: the JSON run report
    refs/notes/scalebox-vouched            git note per rewrite commit this user's engine made or
                                           checked: its HMAC under the user's key (userkey)
    refs/scalebox/cache/<fingerprint>      rewrite cache: tree "ab/<38 hex>~<user>" -> rewritten
                                           blob, "ab/<38 hex>~<user>.json" -> "sbx-signed <HMAC>"
                                           line and file report (keyed by source file (cache_key) and user;
                                           signed as the notes are)

Concurrency: libgit2 compares-and-swaps an existing ref under its lock file, but *creating* a ref
(``force=False``) checks for existence before taking that lock, so two writers can both "create"
the same ``run/NNNN`` and one branch is silently lost (measured: 9 of 1500 contested names with 4
processes). All ref updates therefore go through one advisory lock (``store.git/scalebox.lock``,
``flock``) held only around the ref update itself; objects are written before it is taken, and
updates of existing refs are still compare-and-swap, so a foreign writer cannot be overwritten.
A writer killed mid-update leaves libgit2's ``<ref>.lock``; the next writer removes it under the
write lock (see ``_RefFailures``) instead of failing forever.

Speed: trees are hashed in Python and written only when missing, and blobs already in the
previous snapshot are never rewritten (libgit2 "freshens" an existing object with a utime call,
~0.2 ms each here), so an unchanged snapshot writes nothing and a one-file change writes a handful
of objects.

Parts: ``common`` (names, records, object encoding), ``refs`` (write lock, ref updates),
``objects``, ``snapshots``, ``runs``, ``sessions``, ``cache``; ``repository`` puts them together.
"""
from __future__ import annotations

from scalebox_cst.store.common import (
    CACHE_PREFIX,
    HOOK_MESSAGE,
    HOOK_PREFIX,
    LOCK_NAME,
    REPORTS_REF,
    RUN_PREFIX,
    SOURCE_REF,
    TRAILER_PIPELINE,
    TRAILER_SOURCE,
    BranchInfo,
    SessionFile,
    SessionInfo,
    StoreError,
)
from scalebox_cst.store.repository import Store

__all__ = [
    "Store", "StoreError", "BranchInfo", "SessionInfo", "SessionFile", "SOURCE_REF", "REPORTS_REF", "RUN_PREFIX",
    "HOOK_PREFIX", "HOOK_MESSAGE", "CACHE_PREFIX", "LOCK_NAME", "TRAILER_SOURCE", "TRAILER_PIPELINE",
]
