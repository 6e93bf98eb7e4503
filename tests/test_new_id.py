"""Entry and record ids (``ids.new_id``): 16 hex characters, unique, increasing within a
process, the first 8 characters unique in it, a tag of their own in a forked child and after a
spent counter. What the increase is for (a SQLite commit writes fewer WAL pages than with
random ids) is tested with the page size in ``tests/storage/test_sqlite_wal_pages.py``."""

from __future__ import annotations

import itertools
import os
import re
import sys
import threading

import pytest

from durable_harness import ids

HEX16 = re.compile(r"[0-9a-f]{16}")


def test_ids_are_16_hex_unique_and_increase() -> None:
    made = [ids.new_id() for _ in range(10_000)]
    assert all(HEX16.fullmatch(i) for i in made)
    values = [int(i, 16) for i in made]
    assert values == sorted(set(values))  # strictly increasing, so no repeat


def test_the_first_eight_characters_name_one_id() -> None:
    # the short prefix the CLI accepts for an entry is unique among one process's ids
    made = [ids.new_id() for _ in range(10_000)]
    assert len({i[:8] for i in made}) == len(made)


def test_a_forked_child_draws_its_own_tag() -> None:
    before = ids.new_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: three ids, then out without running any test machinery
        try:
            os.write(write, " ".join(ids.new_id() for _ in range(3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    after = ids.new_id()
    assert len(child) == 3 and all(HEX16.fullmatch(i) for i in child)
    # the parent's counter went on undisturbed; the child counts under a tag of its own
    assert int(after, 16) > int(before, 16) and after[8:] == before[8:]
    assert {c[8:] for c in child} == {child[0][8:]} != {before[8:]}
    assert not {before, after} & set(child)


def test_a_spent_counter_draws_a_new_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    tag = ids._id_block[0]
    monkeypatch.setattr(ids, "_id_block", (tag, itertools.count(ids._ID_BLOCK - 1)))
    last = ids.new_id()
    first = ids.new_id()
    assert last == f"ffffffff{tag:08x}"
    assert HEX16.fullmatch(first) and int(first[:8], 16) < 2**31
    assert first[8:] != last[8:]


def test_threads_crossing_a_spent_counter_never_pair_it_with_the_new_tag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old_tag = ids._id_block[0]
    monkeypatch.setattr(ids, "_id_block", (old_tag, itertools.count(ids._ID_BLOCK - 2_000)))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads swap often, inside new_id too
    made: list[list[str]] = [[] for _ in range(8)]

    def take(out: list[str]) -> None:
        out.extend(ids.new_id() for _ in range(2_000))

    try:
        threads = [threading.Thread(target=take, args=(out,)) for out in made]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    every = [i for out in made for i in out]
    assert len(set(every)) == len(every) == 16_000
    olds = [i for i in every if int(i[8:], 16) == old_tag]
    assert len(olds) == 2_000 and all(int(i[:8], 16) >= ids._ID_BLOCK - 2_000 for i in olds)
    news = {i[8:] for i in every} - {f"{old_tag:08x}"}
    assert len(news) == 1  # one new block, drawn once
    assert all(int(i[:8], 16) < 2**31 for i in every if i[8:] in news)
