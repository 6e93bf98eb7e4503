"""The SQL core both database backends share: one schema's queries, the row decoding and damage
scan (:mod:`.session`, :mod:`.scan`) and the catalogue's lookups (:mod:`.catalogue`), written
once over a :class:`~.session.Dialect`; ``storage/sqlite`` and ``storage/postgres`` add what
differs (connections and commits)."""
