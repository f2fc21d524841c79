"""The volunteer pool's spool: job files and uploads as records in a few segment files (volunteer/jobs.Spool)."""

from __future__ import annotations

import os

from gridbot.volunteer.jobs import Spool


def _segments(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_records_are_kept_replaced_and_dropped(tmp_path):
    spool = Spool(tmp_path)
    spool.put("gb1_aa_job", b"echo 1\n")
    spool.put("gb2_bb_out", b"")
    spool.put("gb1_aa_job", b"echo one\n")  # replaced
    assert spool.get("gb1_aa_job") == b"echo one\n" and spool.get("gb2_bb_out") == b""
    assert spool.size("gb1_aa_job") == 9 and spool.size("nothing") is None and spool.get("nothing") is None
    assert "gb2_bb_out" in spool and len(spool) == 2
    assert spool.drop("gb1_aa_job") and not spool.drop("gb1_aa_job")
    assert spool.get("gb1_aa_job") is None and len(spool) == 1
    spool.close()


def test_records_outlive_the_process_and_a_torn_last_one_is_dropped(tmp_path):
    spool = Spool(tmp_path)
    spool.put("gb1_aa_job", b"job one\nwith lines\n")
    spool.put("gb2_bb_out", bytes(range(256)) * 4)
    spool.put("gb3_cc_out", b"torn")
    spool.close()
    (segment,) = _segments(tmp_path)
    with open(tmp_path / segment, "r+b") as f:  # the process died in the middle of the last write
        f.truncate(os.path.getsize(tmp_path / segment) - 3)
    again = Spool(tmp_path)
    assert again.get("gb1_aa_job") == b"job one\nwith lines\n"
    assert again.get("gb2_bb_out") == bytes(range(256)) * 4
    assert "gb3_cc_out" not in again and len(again) == 2
    again.put("gb4_dd_job", b"new")  # new records go to a new segment, never after the torn one
    assert len(_segments(tmp_path)) == 2
    again.close()
    third = Spool(tmp_path)
    assert third.get("gb4_dd_job") == b"new" and third.get("gb1_aa_job") == b"job one\nwith lines\n"
    third.close()


def test_a_segment_is_removed_once_nothing_in_it_is_live(tmp_path):
    spool = Spool(tmp_path, segment_bytes=100)
    for n in range(10):
        spool.put(f"gb{n}_aa_job", b"x" * 40)
    assert spool.segments > 3
    for n in range(10):
        spool.drop(f"gb{n}_aa_job")
    assert spool.segments == 1 and len(_segments(tmp_path)) == 1, "only the current segment is left"
    spool.close()
    assert len(Spool(tmp_path)) == 0


def test_compaction_moves_the_few_live_records_of_a_mostly_dead_segment(tmp_path):
    spool = Spool(tmp_path, segment_bytes=1000)
    for n in range(40):
        spool.put(f"gb{n}_aa_job", bytes([n]) * 90)
    for n in range(40):
        if n % 10:
            spool.drop(f"gb{n}_aa_job")
    before = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert spool.compact() == 4
    assert [spool.get(f"gb{n}_aa_job") for n in (0, 10, 20, 30)] == [bytes([n]) * 90 for n in (0, 10, 20, 30)]
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < before / 3
    assert spool.compact() == 0
    spool.close()
    again = Spool(tmp_path)
    assert len(again) == 4 and again.get("gb30_aa_job") == bytes([30]) * 90


def test_older_names_what_was_written_before_a_time(tmp_path):
    spool = Spool(tmp_path)
    spool.put("gb1_aa_job", b"old", when=0.0)
    spool.put("gb2_bb_job", b"new")
    assert spool.older(60) == ["gb1_aa_job"]
    spool.close()


def test_a_name_that_would_break_the_record_format_is_not_read_back(tmp_path):
    spool = Spool(tmp_path)
    spool.put("gb1_aa_out", b"gb2_bb_out 3\nabc\n")  # data that looks like a record is data
    spool.close()
    again = Spool(tmp_path)
    assert again.get("gb1_aa_out") == b"gb2_bb_out 3\nabc\n" and "gb2_bb_out" not in again


def test_a_name_the_segments_cannot_hold_is_refused(tmp_path):
    import pytest

    spool = Spool(tmp_path)
    with pytest.raises(ValueError, match="not 1-200 letters"):
        spool.put("two words", b"x")
    assert len(spool) == 0
