#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora, fuzz/corpus/<fuzzer>/ (and each op
family's op_args_fuzzer seeds, plugins/<family>/fuzz/op_args_fuzzer/): a few
small valid and near-valid inputs each. Run it again after changing an input format.

    fuzz/make_seeds.py BUILD_DIR      e.g. build/asan

Needs BUILD_DIR/bin/kreg (op and kernel order, default parameters, a tuned
table) and protoc (protobuf messages from their text format).
"""
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(fuzzer, name, data):
    path = CORPUS / fuzzer / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def encode(proto, message, text):
    """A protobuf message, from its text format, by protoc."""
    return subprocess.run(["protoc", f"--encode={message}", f"-I{proto.parent}", str(proto)],
                          input=text.encode(), capture_output=True, check=True).stdout


def varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if n == 0:
            return bytes(out)


# ---- .npy -------------------------------------------------------------------

def npy(descr, shape, data, version=1, quote="'", fortran="False", pad=True):
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = f"{{{quote}descr{quote}: {quote}{descr}{quote}, {quote}fortran_order{quote}: {fortran}, " \
             f"{quote}shape{quote}: ({dims}), }}"
    size_bytes = 2 if version == 1 else 4
    total = 6 + 2 + size_bytes + len(header) + 1
    if pad:
        header += " " * ((64 - total % 64) % 64)
    header += "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + data


def npy_seeds():
    f32 = struct.pack("<6f", 1.5, -2.0, 0.0, float("inf"), float("nan"), 3.25)
    write("npy_fuzzer", "f32_2x3.npy", npy("<f4", (2, 3), f32))
    write("npy_fuzzer", "i32_4.npy", npy("<i4", (4,), struct.pack("<4i", 0, 1, -1, 7)))
    write("npy_fuzzer", "bf16_2x2_v2.npy", npy("<u2", (2, 2), struct.pack("<4H", 0x3F80, 0xBF80, 0x7FC0, 0), version=2))
    write("npy_fuzzer", "f32_scalar_v3.npy", npy("<f4", (), struct.pack("<f", 1.0), version=3, quote='"'))
    write("npy_fuzzer", "f32_empty_0x5.npy", npy("<f4", (0, 5), b"", pad=False))
    write("npy_fuzzer", "i32_group_sizes_3.npy", npy("<i4", (3,), struct.pack("<3i", 2, 0, 5)))
    # Near-valid: cut short, Fortran order, a dtype kreg does not read.
    write("npy_fuzzer", "bad_truncated.npy", npy("<f4", (2, 3), f32[:10]))
    write("npy_fuzzer", "bad_fortran.npy", npy("<f4", (2, 3), f32, fortran="True"))
    write("npy_fuzzer", "bad_f8.npy", npy("<f8", (1,), struct.pack("<d", 1.0)))


# ---- worker protocol ------------------------------------------------------------

def worker_seeds(kernels):
    proto = ROOT / "autotune" / "worker.proto"

    def frame(message, text):
        body = encode(proto, f"kreg.worker.{message}", text)
        return varint(len(body)) + body

    def params(kernel):
        return " ".join(f'params {{ name: "{n}" value: "{v}" }}' for n, v in kernels[kernel])

    job = ('op: "topk" values { name: "batch" value: "2" } values { name: "n" value: "16" } '
           'values { name: "k" value: "3" } dtypes { name: "" value: "f32" } dist: "normal" seed: 1 '
           'plugins: "kreg_topk.so" warmup: 1 max_seconds_per_run: 1')
    check = 'check { id: 1 kernel: "topk/blockwise" candidates { %s } candidates { params { name: "x" value: "1" } } }' % (
        params("topk/blockwise"))
    run = 'run { id: 2 kernel: "topk/sort" %s reps: 3 }' % (params("topk/sort").replace("params", "params"))
    write("worker_fuzzer", "worker_topk", b"\x00" + frame("Job", job) + frame("Request", check) + frame("Request", run))
    gmm_job = ('op: "gmm" values { name: "m" value: "8" } values { name: "k" value: "4" } '
               'values { name: "n" value: "4" } values { name: "groups" value: "2" } '
               'with: "existing_out" dtypes { name: "lhs" value: "bf16" } dist: "uniform" partition: "skewed"')
    gmm_check = 'check { id: 7 kernel: "gmm/tiled" candidates { %s } }' % params("gmm/tiled")
    write("worker_fuzzer", "worker_gmm", b"\x00" + frame("Job", gmm_job) + frame("Request", gmm_check))
    ring_job = ('op: "allreduce" values { name: "count" value: "100" } ranks: 2 comm_timeout: 5')
    ring_check = 'check { id: 3 kernel: "allreduce/ring" candidates { %s } }' % params("allreduce/ring")
    write("worker_fuzzer", "worker_allreduce", b"\x00" + frame("Job", ring_job) + frame("Request", ring_check))
    write("worker_fuzzer", "worker_bad_truncated", b"\x00" + frame("Job", job)[:-3])

    replies = (frame("Reply", "started { id: 1 }") +
               frame("Reply", 'done { id: 1 status: OK median_ns: 1000 min_ns: 900 max_ns: 1200 reps: 5 }') +
               frame("Reply", 'checked { id: 2 legality { legal: true } legality { why: "k > n" } '
                              'legality { error: true why: "no kernel" } }') +
               frame("Reply", 'done { id: 3 status: WRONG_RESULT error: "values[0]" }') +
               frame("Reply", 'fatal { message: "cannot load plugin" }'))
    write("worker_fuzzer", "tuner_replies", b"\x01" + replies)
    write("worker_fuzzer", "tuner_bad_varint", b"\x01" + b"\xff" * 11)


# ---- op arguments -----------------------------------------------------------------

# Each family's ops, in plugins/<family>/fuzz/op_args.json: per op the
# --dims, --dtype, --with, --mesh and ranks of a small valid problem, and
# near-valid inputs (k > n, a bad dtype, dims at their limits) by seed name:
# [kernel index, the text after the head]. Their seeds go to that family's
# plugins/<family>/fuzz/op_args_fuzzer/.
def family_problems():
    problems = {}
    for spec in sorted((ROOT / "plugins").glob("*/fuzz/op_args.json")):
        for op, problem in json.loads(spec.read_text()).items():
            problems[op] = (spec.parent, problem)
    return problems


def op_args_seeds(ops, kernels):
    problems = family_problems()
    for op_index, op in enumerate(ops):
        if op not in problems:
            continue
        folder, p = problems[op]
        out = folder / "op_args_fuzzer"

        def write_seed(name, data):
            out.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)

        names = sorted(k for k in kernels if k.split("/")[0] == op)
        for kernel_index, kernel in enumerate(names):
            lines = [p["dims"], p["dtype"], p["with"], p["mesh"]] + [f"{n}={v}" for n, v in kernels[kernel]]
            head = bytes([op_index, kernel_index, p["ranks"]])
            write_seed(kernel.replace("/", "_"), head + "\n".join(lines).encode())
        for name, (kernel_index, text) in p.get("near_valid", {}).items():
            write_seed(name, bytes([op_index, kernel_index, 0]) + text.encode())


# ---- tables ---------------------------------------------------------------------------

def table_seeds(kreg):
    proto = ROOT / "tuning_db" / "kreg_tuning.proto"
    with tempfile.TemporaryDirectory() as tmp:
        lut = pathlib.Path(tmp) / "t.lut"
        subprocess.run([str(kreg), "tune", "topk", "--dims", "batch=2,n=64,k=4", "--variants", "sort,heap",
                        "--strategy", "exhaustive", "--reps", "2", "--warmup", "0", "--db", str(lut)],
                       check=True, capture_output=True)
        binary = lut.read_bytes()
        text = subprocess.run([str(kreg), "db", "export", str(lut)], check=True, capture_output=True).stdout
    write("table_fuzzer", "topk.kdb", binary)
    write("table_fuzzer", "topk.txtpb", text)
    # Schema 1 (no checksum): what mutations of a binary table can get past.
    v1 = text.decode().replace("schema_version: 2", "schema_version: 1")
    write("table_fuzzer", "topk_v1.kdb", encode(proto, "kreg.tuning.Database", v1))
    write("table_fuzzer", "bad_truncated.kdb", binary[: len(binary) * 2 // 3])
    write("table_fuzzer", "bad_newer.txtpb", "schema_version: 99\n")
    write("table_fuzzer", "hand.txtpb", """schema_version: 1
machines { id: "0123456789abcdef" cpu_model: "fuzz" isa: "avx2" cores: 2 }
entries {
  key { op: "gmm" dtype: "f32" dims { name: "m" value: 64 } dims { name: "k" value: 32 }
        dims { name: "n" value: 16 } dims { name: "groups" value: 4 } machine_id: "0123456789abcdef" }
  trials { variant: "tiled" variant_version: 1 median_ns: 100 status: OK
           config { params { name: "tm" int_value: 64 } params { name: "micro" choice: "generic" } } }
  trials { variant: "reference" variant_version: 1 median_ns: 900 status: OK }
  trials { variant: "tiled" variant_version: 1 median_ns: 50 status: ILLEGAL error: "tm > m" }
}
entries {
  key { op: "allreduce" dtype: "f32" dims { name: "count" value: 4096 } dims { name: "ranks" value: 2 }
        machine_id: "0123456789abcdef" data_class: "backend=threads" }
  best { variant: "ring" variant_version: 1 median_ns: 2000 status: OK config { params { name: "chunks" int_value: 2 } } }
  incomplete: true
}
comm_models { machine_id: "0123456789abcdef" backend: "threads" alpha_s: 1e-6 beta_s_per_byte: 1e-10
              gamma_s_per_byte: 1e-10 ranks: 2 }
entry_count: 2
""")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    kreg = pathlib.Path(sys.argv[1]).resolve() / "bin" / "kreg"
    listing = json.loads(subprocess.run([str(kreg), "list", "--json"], check=True, capture_output=True).stdout)
    ops = sorted({op["op"] for plugin in listing["plugins"] for op in plugin["ops"]})
    kernels = {}
    for plugin in listing["plugins"]:
        for k in plugin["kernels"]:
            pairs = []
            for name, value in k["default_params"].items():
                value = ",".join(str(v) for v in value) if isinstance(value, list) else value
                pairs.append((name, value))
            kernels[k["kernel"]] = pairs
    for fuzzer in ("npy_fuzzer", "table_fuzzer", "worker_fuzzer"):
        shutil.rmtree(CORPUS / fuzzer, ignore_errors=True)
    for folder in (ROOT / "plugins").glob("*/fuzz/op_args_fuzzer"):
        shutil.rmtree(folder)
    npy_seeds()
    worker_seeds(kernels)
    op_args_seeds(ops, kernels)
    table_seeds(kreg)


if __name__ == "__main__":
    main()
