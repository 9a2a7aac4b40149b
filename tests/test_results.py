"""The result record contract and its atomic write."""
import json
import os

import pytest

from ddlbench.record.results import SCHEMA, Record, atomic_write_json, check_record, error_info, load_result


def test_failed_record_is_valid_and_roundtrips(tmp_path):
    rec = Record.new("r1", {"framework": {"name": "ddp", "variant": "default"},
                            "model": {"name": "gpt2_tiny"}, "run": {"seed": 1, "precision": "fp32"}})
    rec.error = error_info("boom", "it broke", rank=1)
    rec.sections["partial"] = {"steps_completed": 3}
    rec.write(tmp_path)
    back = load_result(tmp_path)
    assert back["schema"] == SCHEMA and back["status"] == "failed"
    assert back["error"] == {"type": "boom", "message": "it broke", "rank": 1}
    assert back["seed"] == 1 and back["framework"]["name"] == "ddp"
    assert back["partial"] == {"steps_completed": 3} and back["warnings"] == []
    assert check_record(back) == []
    # JSON -> Record -> JSON is the identity: the required fields typed, the rest kept as sections
    again = Record.from_json(back)
    assert again.sections == {"partial": {"steps_completed": 3}} and again.to_json() == back


def test_invalid_records_are_refused(tmp_path):
    rec = Record.new("r1", {}, status="ok")
    problems = check_record(rec.to_json())
    assert "ok result without timing" in problems
    with pytest.raises(ValueError, match="invalid result"):
        rec.write(tmp_path)
    assert not (tmp_path / "result.json").exists()
    rec = Record.new("r1", {}, status="failed").to_json()
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


def _read_while_writing(path, write, versions, rounds: int = 60) -> tuple[int, int]:
    """A writer thread rewrites `path` `rounds` times alternating two versions while this thread
    reads it as fast as it can. Returns (reads, reads that were not a whole version)."""
    import threading

    done = threading.Event()

    def writer():
        for i in range(rounds):
            write(path, versions[i % 2])
        done.set()

    write(path, versions[1])
    t = threading.Thread(target=writer)
    t.start()
    reads = torn = 0
    while not done.is_set():
        reads += 1
        try:
            if json.loads(path.read_text()) not in versions:
                torn += 1
        except ValueError:
            torn += 1
    t.join()
    return reads, torn


def test_a_concurrent_reader_never_sees_half_a_result(tmp_path):
    """docs/guarantees.md: a reader sees the old file or the new one. The same reader does catch a plain
    open-write-close writer that is caught between two halves of its file."""
    import time
    versions = [{"v": 0, "pad": "a" * 400_000}, {"v": 1, "pad": "b" * 400_000}]
    reads, torn = _read_while_writing(tmp_path / "atomic.json", atomic_write_json, versions)
    assert reads >= 5 and torn == 0     # it did read while the writer wrote

    def plain(path, obj):
        text = json.dumps(obj)
        with open(path, "w") as f:
            f.write(text[:len(text) // 2])
            f.flush()
            time.sleep(0.002)       # the window every non-atomic writer has, made wide
            f.write(text[len(text) // 2:])
    _, torn = _read_while_writing(tmp_path / "plain.json", plain, versions)
    assert torn > 0
