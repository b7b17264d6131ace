"""Bad input through the Python package, one test per defect of the second
hardening round (the command line's are tests/hardening_test.cc): each is
an exception with kreg's one-line message, and no file changes."""

import os
import re
import subprocess
import sys

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


# 9: an array in another byte order than this machine's is refused, not read
# as if it were native (x.astype('>f4') read 1.73 as 2e35).
@pytest.mark.parametrize("dtype", [">f4", ">i4", ">u2"])
def test_foreign_byte_order_is_refused(dtype):
    x = np.arange(12).reshape(2, 6).astype(dtype)
    with pytest.raises(ValueError, match=r"'input': its bytes are in big-endian order .*newbyteorder"):
        kreg.run("topk/heap", input=x, k=2)
    with pytest.raises(ValueError, match=r"'values': its bytes are in big-endian order"):
        kreg.run("topk/heap", input=np.zeros((2, 6), np.float32), k=2,
                 out={"values": np.zeros((2, 2), ">f4")})
    native = x.astype(x.dtype.newbyteorder("="))
    if native.dtype == np.float32:
        assert kreg.run("topk/heap", input=native, k=2)["indices"].tolist() == [[5, 4], [5, 4]]


# 10: outputs that overlap each other or an input are refused; bf16 bits
# must be uint16.
def test_overlapping_outputs_are_refused():
    x = np.zeros((2, 6), np.float32)
    b = np.zeros((2, 2), np.int32)
    with pytest.raises(ValueError, match="'indices' and 'values' share memory|'values' and 'indices' share memory"):
        kreg.run("topk/heap", input=x, k=2, out={"values": b.view(np.float32), "indices": b})
    buf = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="share memory"):
        kreg.run("topk/heap", input=buf[:8].reshape(2, 4), k=2, out={"values": buf[6:].reshape(2, 2)})
    # Disjoint parts of one buffer are fine.
    both = np.zeros(12, np.float32)
    out = kreg.run("topk/heap", input=both[:8].reshape(2, 4), k=1, out={"values": both[8:10].reshape(2, 1)})
    assert out["values"].base is not None


def test_bf16_to_float32_takes_uint16_bits_only():
    assert kreg.bf16_to_float32(np.array([0x3F80], np.uint16)).tolist() == [1.0]
    with pytest.raises(ValueError, match="expected uint16 bf16 bits, got dtype float32"):
        kreg.bf16_to_float32(np.ones(3, np.float32))


# 11: Ctrl-C stops kreg.tune within a second, keeps what was measured and
# raises KeyboardInterrupt, with or without a progress callback.
@pytest.mark.parametrize("progress", ["None", "lambda p: None"])
def test_ctrl_c_stops_a_sweep(tmp_path, progress):
    script = f"""
import os, signal, sys, threading, time
import kreg
threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
start = time.time()
try:
    kreg.tune("topk", {{"batch": 128, "n": 201088, "k": 64}}, sys.argv[1], strategy="exhaustive",
              progress={progress})
    print("returned")
except KeyboardInterrupt:
    print("interrupted", time.time() - start - 2.0, len(kreg.TuningDb(sys.argv[1])))
"""
    table = tmp_path / "t.lut"
    done = subprocess.run([sys.executable, "-c", script, str(table)], capture_output=True, text=True, timeout=120)
    words = done.stdout.split()
    assert words and words[0] == "interrupted", done.stdout + done.stderr
    assert float(words[1]) < 1.0, done.stdout
    assert int(words[2]) == 1, done.stdout  # the problem's measurements so far are in the table


# 6: a plugin whose init crashes while Registry() loads it is named on the
# way down (the process's last line).
@pytest.mark.skipif("KREG_TEST_PLUGIN_DIR" not in os.environ, reason="the test plugins' folder is not given")
def test_a_plugin_that_crashes_while_loading_is_named():
    folder = os.path.join(os.environ["KREG_TEST_PLUGIN_DIR"], "init_crashes")
    done = subprocess.run([sys.executable, "-c", f"import kreg; kreg.Registry({folder!r})"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert f"kreg: plugin {folder}/test_init_crashes.so crashed while loading" in done.stderr, done.stderr
