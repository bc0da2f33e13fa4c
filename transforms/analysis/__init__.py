"""Analysis that every transform family can use; nothing here knows a transform.

Over Python's ``ast``: call arguments and signatures (:mod:`.calls`), child nodes in source order
and the names a statement binds (:mod:`.nodes`).

Over libcst, the static facts a loop rewrite must prove (moved here from ``loop_analysis``, which
keeps the old import path): loop targets, flat bodies and early exits (:mod:`.bodies`), names read
and bound, reads after a loop (:mod:`.reads`), purity of expressions, the one table of pure calls
every transform consults and the tables of exact and inexact elementwise functions (:mod:`.purity`),
element-by-element expressions (:mod:`.elementwise`), rebound names, globals and what a star import
binds (:mod:`.scopes`), loop headers and run-time guards (:mod:`.loops`), ast <->
libcst statement matching for the cheap candidate search (:mod:`.statements`), rebuilding a module
with nodes replaced (:mod:`.rewriting`).
"""
