"""Bad input through the Python package, one test per defect of the second
hardening round (the command line's are tests/hardening_test.cc): each is
an exception with kreg's one-line message, and no file changes."""

import re

import numpy as np
import pytest

import kreg

A = {"batch": 2, "n": 300, "k": 4}
B = {"batch": 64, "n": 4096, "k": 16}


@pytest.fixture(scope="module")
def registry():
    return kreg.Registry()


# 0: a user's own table answers before the shipped ones where it matches as
# well; the shipped ones fill what it lacks, and the answer names its table.
def test_a_users_table_answers_before_the_shipped_ones(registry, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    kreg.tune("topk", [A, B], shipped / "class.txtpb", registry=registry, variants=["heap"], reps=2)
    mine = tmp_path / "mine.lut"
    kreg.tune("topk", A, mine, registry=registry, variants=["sort"], reps=2)
    monkeypatch.setenv("KREG_TABLE_PATH", str(shipped))
    db = kreg.TuningDb(mine)
    got = db.query("topk", A, registry=registry)
    assert (got["kernel"], got["match"], got["table"]) == ("topk/sort", "exact", str(mine))
    assert got["explanation"].endswith(f", in {mine}")
    got = db.query("topk", B, registry=registry)
    assert (got["kernel"], got["match"], got["table"]) == ("topk/heap", "exact", "the shipped tables")
    dispatcher = kreg.Dispatcher(db, registry=registry)
    dispatcher.run("topk", input=np.zeros((2, 300), np.float32), k=4)
    assert dispatcher.last["kernel"] == "topk/sort"


# 3: a table's numbers are input: a thread count oneTBB cannot make (it
# crashed Dispatcher.run) or a parameter outside the variant's space fails
# the load, naming the file and the entry.
def test_a_tables_hostile_numbers_fail_the_load(registry, tmp_path):
    path = tmp_path / "t.txtpb"
    kreg.tune("topk", A, path, registry=registry, variants=["sort"], reps=2)
    good = path.read_text()
    bad = re.sub(r"threads: \d+", "threads: 2147483647", good, count=1)
    assert bad != good
    path.write_text(bad)
    with pytest.raises(OSError, match=re.escape("threads: expected 0 (all cores) to 1024, got 2147483647")):
        kreg.Dispatcher(path, registry=registry)
    bad = re.sub(r'choice: "\w+"', 'choice: "bogus"', good, count=1)
    path.write_text(bad)
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: entry 0 .*'bogus' is not a choice"):
        kreg.Dispatcher(path, registry=registry)
    assert path.read_text() == bad


# Python's own numbers go through the same bounds as the command line's.
@pytest.mark.parametrize("args,message", [
    ({"budget": float("nan")}, "budget: expected 0 to 604800 seconds (a week), got nan"),
    ({"timeout": float("inf")}, "timeout: expected more than 0 and at most 604800 seconds (a week), got inf"),
    ({"timeout": 0}, "timeout: expected more than 0"),
    ({"reps": 0}, "reps: expected 1 to 1000000, got 0"),
    ({"threads": 5000}, "threads: expected 0 (all cores) to 1024, got 5000"),
])
def test_tune_arguments_are_bounded(registry, tmp_path, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        kreg.tune("topk", A, tmp_path / "t.lut", registry=registry, **args)
    assert not (tmp_path / "t.lut").exists()
