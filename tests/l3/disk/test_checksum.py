"""The checksum every slot carries (xxh3_64 of the payload, and of the header's first 120 bytes) is the same value
whichever xxhash build computes it: xxHash's own published vectors (cli/xsum_sanity_check.c, XXH3_64bits, seed 0),
and this format's frozen values for a GLM-5 page (one-shot and as the 78 layer chunks a layer-first reload hashes),
so raising the xxhash pin (issue 28: 4.1.0 dispatches to AVX2 / AVX-512 at run time) changes nothing on disk and
needs no format version. Also what `checksum_build()` reports about the build (bench and doctor print it)."""

import pathlib
import re
import sys
import threading
import time

import numpy as np
import pytest
import xxhash

from sglang_glm_ext.l3.disk import format as F

ROOT = pathlib.Path(__file__).resolve().parents[3]

# xxHash's sanity buffer: byte i is the top byte of PRIME32 * PRIME64**i (mod 2**64).
PRIME32, PRIME64 = 2654435761, 0x9E3779B185EBCA8D
# XSUM_XXH3_testdata, seed 0: every length class of XXH3, up to 3 stripe blocks (the vectorised accumulate path).
PUBLISHED = {0: 0x2D06800538D394C2, 1: 0xC44BDFF4074EECDB, 6: 0x27B56A84CD2D7325, 12: 0xA713DAF0DFBB77E7,
             24: 0xA3FE70BF9D3510EB, 48: 0x397DA259ECBA1F11, 80: 0xBCDEFBBB2C47C90A, 195: 0xCD94217EE362EC3A,
             403: 0xCDEB804D65C6DEA4, 512: 0x617E49599013CB6B, 2048: 0xDD59E2C3A5F038E0, 2099: 0xC6B9D9B3FC9AC765,
             2240: 0x6E73A90539CF2948, 2367: 0xCB37AEB9E5D361ED}
GLM5_PAGE, GLM5_CHUNK = 78 * 41_984, 41_984
# This format's values, computed by xxhash 4.0.2 (SSE2 only) and 4.1.0 (AVX-512 dispatched) alike: frozen.
FROZEN = {GLM5_PAGE: 0x2BE67A92CB082386, 1 << 20: 0x7ADE52BBFBD697BA}
KEY = "0123456789abcdef" * 4
NS = F.Namespace("glm-5", "fp8_e4m3", "page_first", 64, 0, 78, "tp0of1")


def sanity_buffer(n: int) -> np.ndarray:
    g = np.full(n, PRIME64, dtype=np.uint64)
    if n:
        g[0] = PRIME32
    with np.errstate(over="ignore"):
        g = np.cumprod(g, dtype=np.uint64)  # wraps mod 2**64, as the C generator does
    return (g >> np.uint64(56)).astype(np.uint8)


def test_the_sanity_buffer_is_xxhashs():
    assert bytes(sanity_buffer(4)) == bytes([(PRIME32 * PRIME64 ** i % 2**64) >> 56 for i in range(4)])


@pytest.mark.parametrize("n", sorted(PUBLISHED))
def test_xxhashs_published_vectors(n):
    b = sanity_buffer(n)
    assert F.payload_checksum(b) == PUBLISHED[n]
    # the layer-first form: the page's pieces where they landed, hashed in order without a copy
    assert F.checksum_views([memoryview(b)[k:k + 100] for k in range(0, n, 100)] or [memoryview(b)]) == PUBLISHED[n]


@pytest.mark.parametrize("n", sorted(FROZEN))
def test_the_formats_own_values_for_a_page_are_frozen(n):
    b = sanity_buffer(n)
    chunk = GLM5_CHUNK if n == GLM5_PAGE else 16 * 1024
    mv = memoryview(b)
    assert F.payload_checksum(b) == FROZEN[n]
    assert F.checksum_views([mv[k:k + chunk] for k in range(0, n, chunk)]) == FROZEN[n]


def test_a_sealed_glm5_slot_is_bit_identical_to_what_earlier_builds_wrote():
    page = sanity_buffer(GLM5_PAGE)
    buf = bytearray(F.slot_bytes_for(GLM5_PAGE))
    buf[:GLM5_PAGE] = page.tobytes()
    assert F.seal_blob(buf, kind=F.PayloadKind.TARGET_KV, content_hash=KEY, ns_digest=NS.digest(),
                       payload_len=GLM5_PAGE) == FROZEN[GLM5_PAGE]
    h = F.parse_header(buf[-F.HEADER_SIZE:])
    assert h is not None and h.payload_checksum == FROZEN[GLM5_PAGE]
    assert int.from_bytes(buf[-8:], "little") == 0x947F233424ED0EAB  # the header checksum, frozen


def test_checksum_build_names_the_build_and_its_vector_unit():
    b = F.checksum_build()
    assert b["version"] == xxhash.VERSION and b["xxhash_c"] == xxhash.XXHASH_VERSION
    if tuple(int(x) for x in xxhash.VERSION.split(".")[:2]) >= (4, 1) and b["cpu_best"] in ("avx2", "avx512"):
        # the dispatcher is there: it reports what it picked, and this CPU's best is used
        assert b["how"].startswith("XXH_featureTest") and b["vector"] == b["cpu_best"] and b["warning"] is None


def test_an_sse2_only_build_on_an_avx2_cpu_is_named_with_its_fix(monkeypatch):
    class NoDispatch:  # the extension of a build before 4.1.0: no XXH_featureTest to ask
        __file__ = None

    monkeypatch.setattr(xxhash, "_xxhash", NoDispatch, raising=False)
    monkeypatch.setattr(F, "_cpu_vector", lambda: "avx2")
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    b = F.checksum_build()
    assert b["vector"] == "sse2" and "before 4.1.0" in b["how"]
    assert "install xxhash>=4.1.0" in b["warning"] and "same checksum values" in b["warning"]


def test_the_dependency_pin_asks_for_the_dispatching_release():
    pins = re.findall(r'"xxhash([<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text())
    assert pins == [">=4.1.0"]
    assert tuple(int(x) for x in xxhash.VERSION.split(".")[:3]) >= (4, 1, 0), "the environment is below the pin"


# ----------------------------------------------------------------- giving the GIL up during a layer-first checksum
@pytest.mark.parametrize("chunk", [100, 16 * 1024, GLM5_CHUNK, 96 * 1024], ids=["100B", "16KiB", "glm5", "96KiB"])
@pytest.mark.parametrize("pause", [1000, 64 * 1024, 256 * 1024])
@pytest.mark.parametrize("kind", ["memoryview", "ndarray", "bytes"])
def test_pausing_for_the_gil_changes_no_value(chunk, pause, kind):
    b = sanity_buffer(GLM5_PAGE)
    cut = [b[k:k + chunk] for k in range(0, GLM5_PAGE, chunk)]
    views = {"memoryview": [memoryview(c) for c in cut], "ndarray": cut, "bytes": [c.tobytes() for c in cut]}[kind]
    assert F.checksum_views(views, gil_pause_bytes=pause) == F.checksum_views(views) == FROZEN[GLM5_PAGE]


class _Sleeps:
    def __init__(self):
        self.calls = []

    def sleep(self, s):
        self.calls.append(s)
        time.sleep(s)


@pytest.mark.parametrize("chunk,pause,want", [
    (16 * 1024, 256 * 1024, 4),  # a 1 MiB layer-first page: every 16 chunks
    (GLM5_CHUNK, 256 * 1024, 12),  # GLM-5's page: every 7 chunks (293,888 B), and once at the end (3 chunks)
    (GLM5_CHUNK, 4 << 20, 1),  # a page below the pause: once, at its end (pages hashed back to back in a run)
    (96 * 1024, 256 * 1024, 0),  # pieces above 64 KiB: xxhash releases the GIL itself, nothing to give up
])
def test_the_gil_is_given_up_every_pause_bytes_of_held_hashing(monkeypatch, chunk, pause, want):
    page = (1 << 20) if chunk == 16 * 1024 else GLM5_PAGE if chunk == GLM5_CHUNK else 32 * 96 * 1024
    b = sanity_buffer(page)
    spy = _Sleeps()
    monkeypatch.setattr(F, "time", spy)
    F.checksum_views([memoryview(b)[k:k + chunk] for k in range(0, page, chunk)], gil_pause_bytes=pause)
    assert spy.calls == [0] * want
    spy.calls.clear()
    F.checksum_views([memoryview(b)[k:k + chunk] for k in range(0, page, chunk)])  # the default: no pause
    assert spy.calls == []


def test_another_thread_runs_while_a_layer_first_checksum_pauses():
    """With the switch interval raised to 30 s, a thread waiting for the GIL gets it during a checksum only where the
    checksum gives it up: never without the pause (xxhash holds the GIL for chunks of 64 KiB or less), and during
    it with the pause -- what SGLang's scheduler thread sees while a reload checks layer-first pages."""
    page, chunk = 64 << 20, 16 * 1024
    b = np.frombuffer(np.random.default_rng(3).bytes(page), np.uint8)
    views = [memoryview(b)[k:k + chunk] for k in range(0, page, chunk)]
    want = F.payload_checksum(b)
    hashing = [False]

    def ran_during_a_checksum(pause: int) -> bool:
        # A fresh thread blocks (GIL released) until the checksum starts, then asks for the GIL once: it records
        # True only if the checksum handed the GIL over before it finished. Without a pause nothing can hand it over
        # (the switch interval is far above a 64 MiB hash), so False there is not luck.
        go, ran = threading.Event(), []
        t = threading.Thread(target=lambda: ran.append(go.wait(60) and hashing[0]), daemon=True)
        t.start()
        hashing[0] = True
        go.set()
        got = F.checksum_views(views, gil_pause_bytes=pause)
        hashing[0] = False
        t.join(60)
        assert got == want and ran, "the waiter thread never ran"
        return ran[0]

    old = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        assert not any(ran_during_a_checksum(0) for _ in range(3))
        # With the pause the waiter may still lose every handover race on a loaded machine; it cannot lose them all
        # for many checksums in a row. The deadline bounds a pause that never gives the GIL up (the failure).
        deadline, tries = time.monotonic() + 60, 0
        while not ran_during_a_checksum(256 * 1024):
            tries += 1
            assert time.monotonic() < deadline, f"no thread ran during {tries} paused checksums"
    finally:
        sys.setswitchinterval(old)
