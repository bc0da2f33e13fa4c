"""Analysis over Python's ``ast`` that every transform family can use: call arguments and
signatures (:mod:`.calls`), child nodes in source order and the names a statement binds
(:mod:`.nodes`). Nothing here knows a transform; nothing here touches libcst."""
