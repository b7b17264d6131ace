"""Tests of kreg.plot (pictures of a tuning table), run by ctest
(python_bindings) with the build's python/ folder on PYTHONPATH. Skipped,
saying so, where matplotlib (Debian: python3-matplotlib) is missing."""

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (Debian: python3-matplotlib)")
from kreg import plot  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _trial(variant, ns, status="OK", **params):
    config = {"params": [{"name": n, "int_value": str(v)} if isinstance(v, int) else {"name": n, "choice": v}
                         for n, v in params.items()]}
    trial = {"variant": variant, "variant_version": 1, "config": config, "status": status}
    if status == "OK":
        trial.update(median_ns=ns, min_ns=ns * 0.9, max_ns=ns * 1.2, reps=10)
    else:
        trial["error"] = "no result within 1 s; worker killed"
    return trial


def _table():
    """Two keys of one op: one with a 3 x 2 grid of a tiled variant and a failure, one plain."""
    grid = [_trial("tiled", 1000.0 * tm / 96 + 50 * tn / 256, tm=tm, tn=tn, micro="avx2")
            for tm in (96, 192, 384) for tn in (256, 512)]
    trials = grid + [_trial("onednn", 1500.0), _trial("tiled", 0, "TIMED_OUT", tm=768, tn=256, micro="avx2")]
    first = {"key": {"op": "gmm", "dtype": "bf16,bf16", "machine_id": "abc",
                     "dims": [{"name": "m", "value": "512"}, {"name": "k", "value": "256"},
                              {"name": "n", "value": "256"}, {"name": "groups", "value": "8"}]},
             "best": trials[0], "trials": trials, "strategy": "exhaustive"}
    second = {"key": {"op": "gmm", "dtype": "bf16,bf16", "machine_id": "abc",
                      "dims": [{"name": "m", "value": "4096"}, {"name": "k", "value": "256"},
                               {"name": "n", "value": "1024"}, {"name": "groups", "value": "8"}]},
              "best": _trial("onednn", 9000.0), "strategy": "halving",
              "trials": [_trial("onednn", 9000.0), _trial("tiled", 12000.0, tm=192, tn=256, micro="avx2")]}
    machine = {"id": "abc", "cpu_model": "Test CPU", "cores": 2, "isa": ["avx2"]}
    return {"schema_version": 2, "machines": [machine], "entries": [first, second]}


def _assert_png(path):
    data = open(path, "rb").read()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5000, path


def test_plot_table_writes_pngs(tmp_path):
    written = plot.plot_table(_table(), str(tmp_path / "out"))
    names = {p.rsplit("/", 1)[-1] for p in written}
    assert "gmm_bf16_m512_k256_n256_groups8.png" in names
    assert "gmm_bf16_m4096_k256_n1024_groups8.png" in names
    assert "gmm_bf16_m512_k256_n256_groups8_tiled_tmxtn.png" in names  # the heat map of the grid
    assert "winners_gmm_bf16.png" in names
    for p in written:
        _assert_png(p)


def test_key_filter(tmp_path):
    written = plot.plot_table(_table(), str(tmp_path), key_filter="m=4096")
    assert sorted(p.rsplit("/", 1)[-1] for p in written) == [
        "gmm_bf16_m4096_k256_n1024_groups8.png", "winners_gmm_bf16.png"]
    assert plot.plot_table(_table(), str(tmp_path), key_filter="no such key") == []


def _one_line_error(capsys):
    err = capsys.readouterr().err
    assert err.startswith("kreg plot: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_main_missing_file(tmp_path, capsys):
    assert plot.main([str(tmp_path / "missing.json"), "--out", str(tmp_path / "out")]) == 1
    assert "missing.json" in _one_line_error(capsys)


def test_main_not_json(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("this is not json\n")
    assert plot.main([str(bad), "--out", str(tmp_path / "out")]) == 1
    assert "not JSON" in _one_line_error(capsys)


def test_main_no_entries(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text('{"schema_version": 2, "entries": []}')
    assert plot.main([str(empty), "--out", str(tmp_path / "out")]) == 1
    assert "no entries" in _one_line_error(capsys)


def test_main_usage_error(tmp_path, capsys):
    assert plot.main([str(tmp_path / "t.json")]) == 2  # no --out
    _one_line_error(capsys)


def test_main_json_file(tmp_path, capsys):
    import json
    table = tmp_path / "t.json"
    table.write_text(json.dumps(_table()))
    assert plot.main([str(table), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 4
    for p in printed:
        _assert_png(p)
