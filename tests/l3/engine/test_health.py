"""The write-path state and its log (issue 20, item 1): counted always, logged once per change of state, at a
bounded rate while it lasts and while it flaps, never a traceback per round."""

import logging

from sglang_glm_ext.l3.engine import health


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _lines(caplog):
    return [r for r in caplog.records if r.name == health.log.name]


def test_a_failure_per_round_for_an_hour_is_a_handful_of_lines(caplog):
    caplog.set_level(logging.INFO, logger=health.log.name)
    clock = Clock()
    p = health.WritePath("index", 0, clock)
    for _ in range(36_000):  # ten failures a second for an hour
        p.failed("mdb_txn_commit: Input/output error")
        clock.t += 0.1
    assert p.failing and p.failures == 36_000
    lines = _lines(caplog)
    assert 1 + 3600 / health.REPEAT_S - 2 <= len(lines) <= 1 + 3600 / health.REPEAT_S  # the start + a summary a minute
    assert "failing" in lines[0].getMessage() and "still failing" in lines[-1].getMessage()
    assert not any(r.exc_info for r in lines)
    for _ in range(health.SETTLE_OK):
        p.ok()
    assert not p.failing and "resumed" in _lines(caplog)[-1].getMessage()


def test_a_flapping_path_is_bounded_and_only_settles_after_real_successes(caplog):
    caplog.set_level(logging.INFO, logger=health.log.name)
    clock = Clock()
    p = health.WritePath("slab", 0, clock)
    for _ in range(1000):  # fails, works once, fails... every 50 ms (a disk at the edge of full)
        p.failed("ENOSPC")
        clock.t += 0.025
        p.ok()
        clock.t += 0.025
    assert p.failing  # one success between failures never ends the episode
    assert len(_lines(caplog)) <= 2
    clock.t += health.SETTLE_S
    p.ok()
    assert not p.failing
    # New episodes right after a recovery: at most one start line per MIN_GAP_S, and a recovery line only for a
    # logged start.
    caplog.clear()
    for _ in range(100):
        p.failed("ENOSPC")
        clock.t += health.SETTLE_S
        p.ok()
        clock.t += 0.1
    elapsed = 100 * (health.SETTLE_S + 0.1)
    assert len(_lines(caplog)) <= 2 * (elapsed / health.MIN_GAP_S + 1)


def test_the_writer_path_keeps_its_traceback_for_the_first_line_only(caplog):
    caplog.set_level(logging.INFO, logger=health.log.name)
    h = health.Health(3, Clock())
    for _ in range(5):
        try:
            raise RuntimeError("a bug")
        except RuntimeError as e:
            h.writer.failed(e, exc_info=not h.writer.failing)
    lines = _lines(caplog)
    assert len(lines) == 1 and lines[0].exc_info is not None and "rank 3" in lines[0].getMessage()
    assert h.failing() == []  # the disk paths are fine
