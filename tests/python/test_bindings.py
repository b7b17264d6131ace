"""The kreg Python package against NumPy: every kernel's results on random
and adversarial inputs, zero-copy runs into the caller's buffers, tables,
the dispatcher, the tuner, and errors. Run by ctest (python_bindings) with
the build's python/ folder on PYTHONPATH."""

import json
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import kreg
from topk_cases import adversarial_rows, topk_reference

RNG = np.random.default_rng(1)


@pytest.fixture(scope="module")
def registry():
    return kreg.Registry()


def kernels_of(registry, op):
    ks = [k for k in registry.kernels(op) if k.available]
    assert ks, f"no available {op} kernels"
    return ks


# ---- top-k: kreg's order, by NumPy ---------------------------------------------

def check_topk(out, x, k, largest=True, starts=None, ends=None, bf16=False):
    expect = topk_reference(kreg.bf16_to_float32(x) if bf16 else x, k, largest, starts, ends)
    np.testing.assert_array_equal(out["indices"], expect)
    # Values are the input's own bits at those indices (the worst value on padding).
    got = out["values"]
    for r in range(x.shape[0]):
        for j in range(k):
            i = expect[r, j]
            if i >= 0:
                a, b = got[r, j], x[r, i]
                assert a.tobytes() == b.tobytes() or (np.isnan(np.float32(kreg.bf16_to_float32(a) if bf16 else a))
                                                      and np.isnan(np.float32(kreg.bf16_to_float32(b) if bf16 else b)))


@pytest.mark.parametrize("shape,k", [((3, 1000), 10), ((7, 257), 257), ((2, 5), 0), ((0, 16), 4), ((1, 1), 1),
                                     ((4, 5000), 300)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_random_matches_numpy(registry, shape, k, largest):
    x = RNG.standard_normal(shape).astype(np.float32)
    for kernel in kernels_of(registry, "topk"):
        out = registry.run(kernel.name, input=x, k=k, largest=largest)
        assert out["values"].shape == (shape[0], k) and out["indices"].dtype == np.int32, kernel.name
        check_topk(out, x, k, largest)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_adversarial_matches_numpy(registry, largest):
    x = adversarial_rows(301, RNG)
    for kernel in kernels_of(registry, "topk"):
        for k in (1, 17, 301):
            check_topk(registry.run(kernel.name, input=x, k=k, largest=largest), x, k, largest)


def test_topk_ragged_rows_pad_with_minus_one(registry):
    x = RNG.standard_normal((4, 100)).astype(np.float32)
    starts = np.array([0, 10, 50, 99], np.int32)
    ends = np.array([100, 12, 90, 99], np.int32)  # the last row is empty
    for kernel in kernels_of(registry, "topk"):
        out = registry.run(kernel.name, input=x, k=5, row_starts=starts, row_ends=ends)
        check_topk(out, x, 5, True, starts, ends)
        assert out["values"][3].tolist() == [-np.inf] * 5


def test_topk_bf16_as_uint16_bits(registry):
    x32 = np.concatenate([adversarial_rows(200, RNG), RNG.standard_normal((3, 200)).astype(np.float32)])
    bits = kreg.float32_to_bf16(x32)
    for kernel in kernels_of(registry, "topk"):
        out = registry.run(kernel.name, input=bits, k=20)
        assert out["values"].dtype == np.uint16
        check_topk(out, bits, 20, bf16=True)


def test_row_strided_input_is_read_in_place(registry):
    big = RNG.standard_normal((5, 3000)).astype(np.float32)
    x = big[:, 100:2100]  # rows 3000 apart, the last dimension contiguous
    out = kreg.run("topk/heap", input=x, k=8)
    check_topk(out, np.ascontiguousarray(x), 8)
    np.testing.assert_array_equal(out["indices"], kreg.run("topk/sort", input=np.ascontiguousarray(x), k=8)["indices"])


# ---- zero copy -------------------------------------------------------------------

def test_outputs_are_written_into_the_callers_buffers(registry):
    x = RNG.standard_normal((6, 4000)).astype(np.float32)
    values = np.full((6, 32), 7.0, np.float32)
    indices = np.full((6, 32), 7, np.int32)
    out = registry.run("topk/radix", input=x, k=32, out={"values": values, "indices": indices})
    assert out["values"] is values and out["indices"] is indices
    check_topk({"values": values, "indices": indices}, x, 32)
    # A view into a larger buffer: written in place, the rest untouched.
    whole = np.zeros((6, 64), np.int32)
    registry.run("topk/sort", input=x, k=32, out={"indices": whole[:, 16:48]})
    np.testing.assert_array_equal(whole[:, 16:48], indices)
    assert not whole[:, :16].any() and not whole[:, 48:].any()


# ---- grouped matmul ---------------------------------------------------------------

def gmm_reference(lhs, rhs, sizes):
    out = np.zeros((lhs.shape[0], rhs.shape[2]))
    start = 0
    for g, size in enumerate(sizes):
        out[start:start + size] = lhs[start:start + size].astype(np.float64) @ rhs[g].astype(np.float64)
        start += size
    return out


@pytest.mark.parametrize("m,k,n,sizes", [(64, 32, 48, [10, 0, 30, 24]), (37, 17, 5, [0, 37]), (20, 8, 8, [0, 0, 7]),
                                         (0, 4, 4, [0, 0])])
def test_gmm_matches_numpy(registry, m, k, n, sizes):
    lhs = RNG.standard_normal((m, k)).astype(np.float32)
    rhs = RNG.standard_normal((len(sizes), k, n)).astype(np.float32)
    group_sizes = np.array(sizes, np.int32)
    expect = gmm_reference(lhs, rhs, sizes)
    for kernel in kernels_of(registry, "gmm"):
        out = registry.run(kernel.name, lhs=lhs, rhs=rhs, group_sizes=group_sizes)
        np.testing.assert_allclose(out["out"], expect, rtol=1e-4, atol=1e-4 * max(k, 1), err_msg=kernel.name)


# ---- tables, the dispatcher, the tuner --------------------------------------------

def kreg_binary():
    return os.path.join(kreg.install_prefix(), "bin", "kreg")


def shipped_table():
    tables = os.path.join(kreg.install_prefix(), "share", "kreg", "tables")
    return os.path.join(tables, sorted(os.listdir(tables))[0])


@pytest.mark.parametrize("dims", ["batch=128,n=201088,k=64", "batch=3,n=777,k=5", "batch=9,n=10,k=10,largest=0"])
def test_query_answers_as_kreg_query(registry, dims):
    table = shipped_table()
    got = kreg.TuningDb(table).query("topk", dims, registry=registry)
    cli = subprocess.run([kreg_binary(), "query", "topk", "--dims", dims, "--db", table, "--json"],
                         capture_output=True, text=True, check=True)
    expect = json.loads(cli.stdout)
    explanation = got.pop("explanation")
    assert got == expect
    text = subprocess.run([kreg_binary(), "query", "topk", "--dims", dims, "--db", table],
                          capture_output=True, text=True, check=True).stdout
    assert f"[{explanation}]" in text


def test_records_are_the_command_lines(registry):
    # Python builds its dicts itself (no JSON in between): the same fields,
    # values and order as kreg list --json and kreg machine --json.
    listing = json.loads(subprocess.run([kreg_binary(), "list", "--json"], capture_output=True, text=True,
                                        check=True).stdout)
    by_name = {k["kernel"]: k for plugin in listing["plugins"] for k in plugin["kernels"]}
    for kernel in registry.kernels():
        info = registry.kernel_info(kernel.name)
        assert list(info) == list(by_name[kernel.name]) and info == by_name[kernel.name], kernel.name
    machine = json.loads(subprocess.run([kreg_binary(), "machine", "--json"], capture_output=True, text=True,
                                        check=True).stdout)
    assert kreg.machine() == machine


def test_repeated_queries_follow_the_policy_asked(registry):
    # One table queried under changing policies (it keeps its answering table
    # between queries) answers as a fresh one does each time.
    db = kreg.TuningDb(shipped_table())
    dims = {"batch": 128, "n": 201088, "k": 64}
    for machine, shipped in [("similar", True), ("strict", False), ("similar", True), ("similar", False),
                             ("strict", True), ("strict", False)]:
        fresh = kreg.TuningDb(shipped_table()).query("topk", dims, registry=registry, machine=machine, shipped=shipped)
        assert db.query("topk", dims, registry=registry, machine=machine, shipped=shipped) == fresh


def test_query_says_why_it_defaults(registry):
    answer = kreg.TuningDb().query("topk", {"batch": 2, "n": 50, "k": 3}, registry=registry, shipped=False)
    assert answer["match"] == "default" and answer["why"]
    assert answer["explanation"].startswith("default: ")


def test_one_registry_and_dispatcher_serve_many_python_threads(registry):
    """Runs release the GIL: four threads calling one Registry and one
    Dispatcher at once all get the single-threaded answers."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 3000), dtype=np.float32)
    lhs, rhs = rng.standard_normal((500, 64), dtype=np.float32), rng.standard_normal((3, 64, 40), dtype=np.float32)
    sizes = np.array([200, 0, 250], np.int32)
    dispatcher = kreg.Dispatcher(registry=registry)
    calls = [lambda: registry.run("topk/radix", input=x, k=20)["indices"],
             lambda: dispatcher.run("topk", input=x, k=20)["indices"],
             lambda: dispatcher.run("gmm", lhs=lhs, rhs=rhs, group_sizes=sizes)["out"]]
    want = [call() for call in calls]
    wrong = []

    def work():
        for _ in range(25):
            for call, w in zip(calls, want):
                if not np.array_equal(call(), w):
                    wrong.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_dispatcher_runs_the_tables_choice(registry, tmp_path):
    x = RNG.standard_normal((4, 2048)).astype(np.float32)
    db = tmp_path / "t.lut"
    result = kreg.tune("topk", {"batch": 4, "n": 2048, "k": 16}, db, registry=registry, variants=["sort", "radix"],
                       reps=3, strategy="exhaustive", thread_round=False)
    assert result["best"]["kernel"] in ("topk/sort", "topk/radix") and result["complete"]
    dispatcher = kreg.Dispatcher(str(db), registry=registry, shipped=False)
    out = dispatcher.run("topk", input=x, k=16)
    check_topk(out, x, 16)
    assert dispatcher.last["match"] == "exact" and dispatcher.last["kernel"] == result["best"]["kernel"]
    assert dispatcher.last["params"] == result["best"]["params"]
    # A shape the table lacks: the nearest tuned one answers.
    dispatcher.run("topk", input=x[:3], k=16)
    assert dispatcher.last["match"] == "nearest"


def test_dispatcher_records_shapes_the_table_does_not_answer_exactly(registry, tmp_path, monkeypatch):
    x = RNG.standard_normal((3, 700)).astype(np.float32)
    db = tmp_path / "t.lut"
    kreg.tune("topk", {"batch": 3, "n": 700, "k": 4}, db, registry=registry, variants=["sort"], reps=3,
              thread_round=False)
    record = tmp_path / "shapes.txt"
    monkeypatch.setenv("KREG_RECORD", str(record))  # read when the Dispatcher is made
    dispatcher = kreg.Dispatcher(str(db), registry=registry, shipped=False)
    for rows in (3, 2, 2):  # exact, then nearest twice
        check_topk(dispatcher.run("topk", input=x[:rows], k=4), x[:rows], 4)
    lines = [line for line in record.read_text().splitlines() if not line.startswith("#")]
    assert lines == ["topk f32 batch=2,n=700,k=4 - cpu"]


def test_tune_reports_progress_and_saves_the_table(registry, tmp_path):
    seen = []
    db = tmp_path / "p.lut"
    results = kreg.tune("topk", [{"batch": 2, "n": 500, "k": 4}, "batch=2,n=900,k=4"], db, registry=registry,
                        variants=["sort", "heap"], reps=3, progress=seen.append)
    assert [r["key"]["dims"]["n"] for r in results] == [500, 900]
    assert seen and all(p["candidates"] > 0 and p["done"] <= p["candidates"] for p in seen)
    assert len(kreg.TuningDb(db)) == 2


def test_a_progress_callback_that_raises_stops_the_sweep(registry, tmp_path):
    def stop(_):
        raise KeyError("enough")
    with pytest.raises(KeyError, match="enough"):
        kreg.tune("topk", {"batch": 2, "n": 500, "k": 4}, tmp_path / "s.lut", registry=registry, progress=stop)


# ---- errors ------------------------------------------------------------------------

@pytest.mark.parametrize("call,message", [
    (lambda: kreg.run("topk/nope", input=np.zeros((2, 4), np.float32), k=1), "topk/nope"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=5), "k=5"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float64), k=1), "float64"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=1, kk=2), "no tensor, dim or attribute 'kk'"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=1, values=np.zeros((2, 1))), "out="),
    (lambda: kreg.run("topk/heap", input=np.zeros(8, np.float32), k=1), "expected 2 dimensions"),
    (lambda: kreg.run("topk/heap", input=np.zeros((4, 6), np.float32)[:, ::2], k=1), "topk"),
    (lambda: kreg.run("topk/heap", input=[1.0, 2.0], k=1), "expected an array"),
    (lambda: kreg.run("topk/heap", k=1, batch=1, n=4), "missing input 'input'"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=1,
                      out={"values": np.zeros((2, 1), np.float32).view(np.int32)}), "values"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=1,
                      out={"values": np.zeros((3, 1), np.float32)}), "batch"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=1, out={"nope": np.zeros(1)}), "nope"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=1, params={"simd": "avx9"}), "avx9"),
    (lambda: kreg.run("gmm/reference", lhs=np.zeros((4, 2), np.float32), rhs=np.zeros((2, 2, 2), np.float32),
                      group_sizes=np.array([3, -1], np.int32)), "group_sizes"),
    (lambda: kreg.TuningDb().query("nope", "n=1"), "nope"),
    (lambda: kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=1, threads=-1), "threads: expected 0 (all cores) to 1024, got -1"),
    (lambda: kreg.tune("topk", "batch=2,n=4,k=9", "/tmp/kreg_never_written.lut"), "k=9"),
])
def test_bad_arguments_are_value_errors(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_readonly_output_is_refused():
    values = np.zeros((2, 1), np.float32)
    values.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        kreg.run("topk/heap", input=np.zeros((2, 4), np.float32), k=1, out={"values": values})


def test_files_raise_os_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such.lut"):
        kreg.TuningDb(tmp_path / "no-such.lut")
    corrupt = tmp_path / "corrupt.lut"
    corrupt.write_bytes(b"\x08\x96\x01 not a table")
    with pytest.raises(OSError, match="not a kreg tuning database"):
        kreg.TuningDb(corrupt)
    with pytest.raises(FileNotFoundError, match="/no/such/plugins"):
        kreg.Registry(plugin_path="/no/such/plugins")


def test_log_level():
    before = kreg.log_level()
    kreg.set_log_level("debug")
    assert kreg.log_level() == "debug"
    kreg.set_log_level(before)
    with pytest.raises(ValueError, match="loud"):
        kreg.set_log_level("loud")


# ---- PyTorch and JAX, where they are installed --------------------------------------

def test_pytorch_tensors_without_copying(registry):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here (pip install torch to run this)")
    x = torch.randn(5, 3000)
    values = torch.empty(5, 20)
    indices = torch.empty(5, 20, dtype=torch.int32)
    out = registry.run("topk/heap", input=x, k=20, out={"values": values, "indices": indices})
    assert out["values"] is values
    expect = torch.topk(x, 20)
    assert torch.equal(values, expect.values) and torch.equal(indices.long(), expect.indices)
    xb = x.to(torch.bfloat16)
    outb = registry.run("topk/radix", input=xb, k=20)
    expectb = torch.topk(xb, 20)
    assert np.array_equal(outb["values"], expectb.values.view(torch.int16).numpy().view(np.uint16))


def test_jax_arrays(registry):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed here (pip install jax to run this)")
    x = jnp.asarray(RNG.standard_normal((3, 1000)).astype(np.float32))
    out = registry.run("topk/sort", input=x, k=7)
    check_topk(out, np.asarray(x), 7)


# ---- device="cuda" -------------------------------------------------------------

def test_device_cuda_without_a_gpu_says_why():
    if kreg.machine().get("gpus"):
        pytest.skip("this machine has a GPU: scripts/gpu_check.sh runs the CUDA kernels")
    x = RNG.standard_normal((2, 50)).astype(np.float32)
    with pytest.raises(RuntimeError, match="device='cuda': "):
        kreg.run("topk/sort", input=x, k=3, device="cuda")
    with pytest.raises(ValueError, match="device 'tpu': expected 'cpu' or 'cuda'"):
        kreg.run("topk/sort", input=x, k=3, device="tpu")


HOST_DEVICE = """
import sys, numpy as np, kreg
plugin, db = sys.argv[1], sys.argv[2]
reg = kreg.Registry(plugin_path=plugin)
x = np.random.default_rng(3).standard_normal((6, 3000)).astype(np.float32)
want = np.argsort(-x, axis=1, kind="stable")[:, :20]
x.setflags(write=False)  # a read-only input is copied over, never back
out = kreg.run("topk/host_device", registry=reg, input=x, k=20, device="cuda")
assert (out["indices"] == want).all() and (out["values"] == np.take_along_axis(x, want, 1)).all()
try:
    kreg.run("topk/heap", registry=reg, input=x, k=20, device="cuda")
    raise SystemExit("a CPU kernel ran on the device")
except ValueError as e:
    assert "topk/heap runs on the CPU, not on a device" in str(e), e
r = kreg.tune("topk", {"batch": 6, "n": 3000, "k": 20}, db, registry=reg, device="cuda",
              variants=["host_device"], strategy="exhaustive", reps=3)
assert r["key"]["machine"].startswith("cuda-") and r["best"]["params"] == {"passes": 1}, r
kreg.tune("topk", {"batch": 6, "n": 3000, "k": 20}, db, registry=reg, variants=["sort"], strategy="exhaustive", reps=3)
table = kreg.TuningDb(db)
q = table.query("topk", "batch=6,n=3000,k=20", device="cuda", shipped=False, registry=reg)
assert q["match"] == "exact" and q["kernel"] == "topk/host_device", q
assert table.query("topk", "batch=6,n=3000,k=20", shipped=False, registry=reg)["kernel"] == "topk/sort"
d = kreg.Dispatcher(table, registry=reg, shipped=False)
out = d.run("topk", input=x, k=20, device="cuda")
assert d.last["kernel"] == "topk/host_device" and d.last["match"] == "exact", d.last
assert (out["indices"] == want).all()
d.run("topk", input=x, k=20)
assert d.last["kernel"] == "topk/sort", d.last
lhs, rhs = np.ones((8, 4), np.float32), np.ones((2, 4, 3), np.float32)
y = kreg.run("gmm/host_device", registry=reg, lhs=lhs, rhs=rhs, group_sizes=np.array([3, 5], np.int32),
             device="cuda")["out"]
assert (y == 4).all(), y
try:  # the data is checked on the host, as on the CPU
    kreg.run("gmm/host_device", registry=reg, lhs=lhs, rhs=rhs, group_sizes=np.array([-1, 5], np.int32),
             device="cuda")
    raise SystemExit("a negative group size ran")
except ValueError as e:
    assert "group_sizes" in str(e), e
print("ok")
"""


def test_device_cuda_through_a_host_memory_stand_in(tmp_path):
    """run, tune, query and the dispatcher with device="cuda", on the test
    backend whose GPU is host memory (a process of its own: the backend is
    chosen once per process)."""
    backend, plugin = os.environ.get("KREG_HOST_DEVICE_BACKEND"), os.environ.get("KREG_HOST_DEVICE_PLUGIN")
    if not backend or not plugin:
        pytest.skip("KREG_HOST_DEVICE_BACKEND and KREG_HOST_DEVICE_PLUGIN unset (ctest sets them)")
    env = dict(os.environ, KREG_CUDA_BACKEND=backend)
    r = subprocess.run([sys.executable, "-c", HOST_DEVICE, plugin, str(tmp_path / "t.txtpb")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
