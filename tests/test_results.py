"""The result record contract and its atomic write."""
import json
import os

import pytest

from bench.results import (SCHEMA, atomic_write_json, check_record, empty_record, error_info,
                           load_result, write_result)


def test_failed_record_is_valid_and_roundtrips(tmp_path):
    rec = empty_record("r1", {"framework": {"name": "ddp", "variant": "default"},
                              "model": {"name": "gpt2_tiny"}, "run": {"seed": 1, "precision": "fp32"}})
    rec["error"] = error_info("boom", "it broke", rank=1)
    write_result(tmp_path, rec)
    back = load_result(tmp_path)
    assert back["schema"] == SCHEMA and back["status"] == "failed"
    assert back["error"] == {"type": "boom", "message": "it broke", "rank": 1}
    assert back["seed"] == 1 and back["framework"]["name"] == "ddp"
    assert check_record(back) == []


def test_invalid_records_are_refused(tmp_path):
    rec = empty_record("r1", {}, status="ok")
    problems = check_record(rec)
    assert "ok result without timing" in problems
    with pytest.raises(ValueError, match="invalid result"):
        write_result(tmp_path, rec)
    assert not (tmp_path / "result.json").exists()
    rec = empty_record("r1", {}, status="failed")
    assert "non-ok result without an error" in check_record(rec)
    rec["status"] = "crashed"
    assert any("status must be" in p for p in check_record(rec))


def test_atomic_write_leaves_no_temp_and_keeps_old_file_on_error(tmp_path):
    path = tmp_path / "x.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["x.json"]
