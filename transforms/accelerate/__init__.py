"""``accelerate.*``: opt-in rewrites whose results are not bitwise the original's
(``[accelerate] level = "reassociated"`` or ``scalebox rewrite --fast``); off at the default level."""
