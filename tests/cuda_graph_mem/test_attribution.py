"""The torch-only core of cg_mem on a CPU: buffer tables, aliasing across families, pool deltas, naming."""

import enum
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

from sglang_glm_ext.cuda_graph_mem import attribution as attr


class Mode(enum.Enum):  # stands in for SGLang's ForwardMode: the core reads only `.name`
    DECODE = 1
    TARGET_VERIFY = 2
    DLLM_EXTEND = 3


@dataclass
class Buffers:
    input_ids: torch.Tensor
    hidden: torch.Tensor
    maybe: Optional[torch.Tensor]
    proxy: dict


def test_rows_name_shape_dtype_and_mib():
    bufs = Buffers(
        input_ids=torch.zeros(256, dtype=torch.int64),
        hidden=torch.zeros(1024, 512, dtype=torch.bfloat16),  # 1024*512*2 B = exactly 1 MiB
        maybe=None,
        proxy={"residual": torch.zeros(8, 4, dtype=torch.float32)},
    )
    rows = {r.name: r for r in attr.buffer_rows(bufs)}
    assert set(rows) == {"input_ids", "hidden", "proxy.residual"}  # None skipped, dict flattened like share_buffers
    assert rows["hidden"].shape == (1024, 512) and rows["hidden"].dtype == "bfloat16"
    assert rows["hidden"].mib == 1.0
    assert rows["input_ids"].nbytes == 256 * 8
    assert rows["proxy.residual"].nbytes == 8 * 4 * 4


def test_span_of_a_strided_view_covers_only_its_own_bytes():
    base = torch.zeros(100, dtype=torch.int64)
    view = base.as_strided((10,), (1,))  # how share_input_buffer hands out a smaller request
    start, end = attr.tensor_span(view)
    assert start == base.data_ptr() and end - start == 10 * 8
    col = torch.zeros(4, 6, dtype=torch.float32)[:, 1]  # stride 6: last element at offset 1 + 3*6
    s, e = attr.tensor_span(col)
    assert s == col.data_ptr() and e - s == (3 * 6 + 1) * 4
    assert attr.tensor_span(torch.zeros(0)) is None


def test_alias_flags_full_partial_and_not_adjacent():
    reg = attr.AliasRegistry()
    big = torch.zeros(100, dtype=torch.float32)
    first = {"input_ids": big[0:50], "positions": torch.zeros(16)}
    rows_a = reg.check_and_register("target_verify", attr.buffer_rows(first))
    assert not any(r.alias_of for r in rows_a)  # nothing earlier to alias onto

    second = {
        "input_ids": big.as_strided((20,), (1,)),  # wholly inside target_verify.input_ids
        "straddle": big[40:60],  # half inside, half past its end
        "adjacent": big[50:60],  # starts exactly where input_ids ends: no shared byte
        "own": torch.zeros(16),
    }
    rows_b = {r.name: r for r in reg.check_and_register("draft", attr.buffer_rows(second))}
    assert rows_b["input_ids"].alias_of == "target_verify.input_ids" and not rows_b["input_ids"].partial
    assert rows_b["straddle"].alias_of == "target_verify.input_ids" and rows_b["straddle"].partial
    assert rows_b["adjacent"].alias_of == "" and rows_b["own"].alias_of == ""

    # A third family aliasing only the draft's private range names the draft, the earlier registrant there.
    third = {"x": big[55:58]}
    (row,) = reg.check_and_register("draft_extend", attr.buffer_rows(third))
    assert row.alias_of == "draft.straddle"  # registered before draft.adjacent


def test_no_alias_inside_one_runner_nor_on_recapture():
    reg = attr.AliasRegistry()
    big = torch.zeros(64)
    bufs = {"a": big[:32], "b": big[16:48]}  # overlap inside one runner: not cross-family aliasing
    assert not any(r.alias_of for r in reg.check_and_register("decode", attr.buffer_rows(bufs)))
    # Recapturing the same runner registers the same spans again; they must not alias onto themselves.
    assert not any(r.alias_of for r in reg.check_and_register("decode", attr.buffer_rows(bufs)))


def _row(name, nbytes, device="cuda:0", alias=""):
    return attr.BufferRow(name, (nbytes,), "uint8", device, nbytes, (0, nbytes), alias_of=alias)


def test_buffer_totals_count_each_row_once():
    rows = [_row("a", 3 << 20), _row("b", 2 << 20, alias="decode.b"), _row("c", 1 << 20, device="cpu"),
            _row("d", 1 << 20)]
    t = attr.buffer_totals(rows)
    assert (t.own_bytes, t.aliased_bytes, t.host_bytes) == (4 << 20, 2 << 20, 1 << 20)


def scripted(values):
    """A stats fn that returns the next scripted reading at each call."""
    it = iter(values)
    return lambda: next(it)


def test_recorder_per_shape_deltas_and_family_total():
    mib = 1 << 20
    stats = scripted([
        {"pool": 0, "pool_live": 0, "reserved": 100 * mib},
        {"pool": 64 * mib, "pool_live": 2 * mib, "reserved": 164 * mib},  # bs=8: pool grows by 64 MiB
        {"pool": 64 * mib, "pool_live": 2 * mib, "reserved": 164 * mib},
        {"pool": 64 * mib, "pool_live": 3 * mib, "reserved": 164 * mib},  # bs=4 reuses the pool: +0
    ])
    rec = attr.PoolDeltaRecorder(stats)
    with rec.shape(attr.shape_label(8)):
        pass
    with rec.shape(attr.shape_label(4, attention_variant="sparse")):
        pass
    assert [s.label for s in rec.shapes] == ["bs=8", "bs=4/sparse"]
    assert rec.shapes[0].delta == {"pool": 64 * mib, "pool_live": 2 * mib, "reserved": 64 * mib}
    assert rec.shapes[1].delta["pool"] == 0 and rec.shapes[1].delta["pool_live"] == mib
    assert rec.totals() == {"pool": 64 * mib, "pool_live": 3 * mib, "reserved": 64 * mib}

    report = attr.FamilyReport("draft", [_row("x", 5 * mib), _row("y", mib, alias="target_verify.y")], rec)
    text = report.format()
    assert "bs=8" in text and "+64.00" in text
    total = report.total_line()
    assert "draft: TOTAL" in total and "5.00 MiB own" in total and "+1.00 MiB aliased" in total
    assert "graph pool +64.00 MiB over 2 shapes" in total and "live after capture +3.00" in total


def test_recorder_survives_a_failing_reader_and_passes_capture_errors_through():
    def broken():
        raise RuntimeError("no allocator")

    rec = attr.PoolDeltaRecorder(broken)
    with rec.shape("bs=1"):
        pass
    assert rec.shapes == [] and "no allocator" in rec.error
    assert "stats unavailable" in attr.FamilyReport("decode", [], rec).total_line()

    rec2 = attr.PoolDeltaRecorder(scripted([{"pool": 0}, {"pool": 8}]))
    with pytest.raises(ValueError, match="capture blew up"):
        with rec2.shape("bs=2"):
            raise ValueError("capture blew up")
    assert rec2.shapes[0].delta == {"pool": 8}  # the failed shape's growth is still recorded


@pytest.mark.parametrize("cls, mode, draft_worker, family", [
    ("DecodeCudaGraphRunner", Mode.DECODE, False, "decode"),
    ("DecodeCudaGraphRunner", Mode.TARGET_VERIFY, False, "target_verify"),
    ("EAGLEDraftCudaGraphRunner", Mode.DECODE, True, "draft"),
    ("EagleDraftCudaGraphRunner", Mode.DECODE, True, "draft"),
    ("EAGLEDraftExtendCudaGraphRunner", "ForwardMode.DRAFT_EXTEND_V2", True, "draft_extend"),
    ("MultiLayerEagleDraftExtendCudaGraphRunner", None, True, "draft_extend"),
    ("DecodeCudaGraphRunner", Mode.TARGET_VERIFY, True, "draft_target_verify"),  # DSpark draft worker
    ("DecodeCudaGraphRunner", Mode.DLLM_EXTEND, False, "dllm_extend"),
])
def test_family_names(cls, mode, draft_worker, family):
    assert attr.family_name(cls, mode, is_draft_worker=draft_worker) == family


def test_labels_unique_and_one_pickle_per_runner_and_rank():
    labels = attr.Labels()
    got = [labels.assign(f) for f in ("target_verify", "draft", "draft_extend", "draft_extend")]
    assert got == ["target_verify", "draft", "draft_extend", "draft_extend#2"]
    files = [attr.pickle_filename(lbl) for lbl in got]
    assert files == ["cuda_graph_mem_target_verify.pickle", "cuda_graph_mem_draft.pickle",
                     "cuda_graph_mem_draft_extend.pickle", "cuda_graph_mem_draft_extend_2.pickle"]
    assert attr.pickle_filename("draft", tp_rank=3) == "cuda_graph_mem_draft_tp3.pickle"
    assert attr.LEGACY_PICKLE not in files


def test_table_shows_alias_and_partial():
    rows = [_row("input_ids", 1 << 20), _row("seq_lens", 1024, alias="target_verify.seq_lens")]
    rows.append(attr.BufferRow("hidden", (4, 8), "bfloat16", "cuda:0", 64, (0, 64), "decode.hidden", True))
    text = attr.format_buffer_table("draft", rows)
    assert "static buffers (3)" in text
    line = next(ln for ln in text.splitlines() if "seq_lens" in ln)
    assert "target_verify.seq_lens" in line and "partial" not in line
    assert "decode.hidden (partial)" in text and "4x8" in text and "bfloat16" in text


def test_core_imports_without_sglang():
    code = ("import sys; import sglang_glm_ext.cuda_graph_mem.attribution; "
            "bad = [m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_graph_pool_created_inside_the_window_grew_from_zero():
    """SGLang 0.5.23 creates its global graph pool inside the capture call, after the hook's first read (seen on
    the H100: the whole-capture line fell back to `reserved`): the pool's counters are absent before and count
    from 0; a counter the reader stops giving, or one that is not the pool's, is left out as before."""
    mib = 1 << 20
    before = {"reserved": 100 * mib, "allocated": 10 * mib}
    after = {"reserved": 136 * mib, "allocated": 42 * mib, "pool": 2 * mib, "pool_live": 0}
    assert attr.diff(before, after) == {"reserved": 36 * mib, "allocated": 32 * mib, "pool": 2 * mib, "pool_live": 0}
    assert attr.diff({"pool": 4 * mib, "other": 1}, {"pool": 6 * mib, "other2": 5}) == {"pool": 2 * mib}
    rec = attr.PoolDeltaRecorder(scripted([{"pool": 2 * mib, "pool_live": 0}]))
    report = attr.FamilyReport("decode", [], rec)
    rec.shapes.append(attr.ShapeDelta("bs=4", {"pool": 2 * mib, "pool_live": 0}))
    report.whole = attr.diff(before, after)
    assert "graph pool +2.00 MiB over 1 shapes" in report.total_line()
    assert "whole capture graph pool +2.00 MiB" in report.total_line()
