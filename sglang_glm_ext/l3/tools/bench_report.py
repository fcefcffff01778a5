"""The L3 bench's report: one table, a section per step of a page size (spill, the raw and fio references, each
reload, exists and staging, HiCacheFile, the notes under it), then the restart row. Each row marked FAIL is also
recorded ("page metric ratio (target)"): the bench's exit status and its one-line summary. Loaded from beside
``bench.py`` (benchmark/l3_ab.py runs that file against an older engine): it reads only the results' dicts."""

from __future__ import annotations

import statistics


def _s_per_gb(x) -> str:
    return "-" if x is None else f"{x:.3f}s/GB"


def _pass(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


class Table:
    """The lines so far, and the FAIL rows (a sub-row, indented, is named after the row above it)."""

    def __init__(self, failed: "list[str] | None"):
        self.lines: list[str] = []
        self.failed = failed
        self.parent = ""

    def row(self, page, metric, a, b, ratio, target, ok) -> None:
        self.lines.append(f"{page:>9} | {metric:<40} | {a:>12} | {b:>12} | {ratio:>6} | {target:>7} | {ok}")
        if not metric.startswith(" "):
            self.parent = metric.split(" vs ")[0]
        if ok == "FAIL" and self.failed is not None:
            what = f"{self.parent}: {metric.strip()}" if metric.startswith(" ") else metric
            self.failed.append(f"{page} {what} {ratio if ratio != '-' else a} (target {target})")

    def note(self, page, text: str) -> None:
        self.lines.append(f"{page:>9} | {text}")


def render(results: list[dict], load: "dict | None", args, failed: "list[str] | None" = None, *,
           checksum: str, gil_pause_page: int) -> str:
    """The table; each row marked FAIL is also appended to `failed` ("page metric"). ``checksum``: the engine's
    checksum line; ``gil_pause_page``: config.GIL_PAUSE_PAGE (a pause at or above it is one at each page's end)."""
    t = Table(failed)
    t.lines += [f"L3 bench: dir={args.dir} size={args.size_gb} GB/page-size repeats={args.repeats} "
                f"io_threads={args.io_threads} reload_threads={args.reload_threads} batch={args.batch_pages} "
                f"(median of repeats; a ratio is the median of each repeat's adjacent pair; CPU = user+sys of the "
                f"process per payload GB)", checksum]
    absent = sorted({r["fio"]["why"] for r in results if not r["fio"].get("write") and not r["fio"].get("read")})
    for why in absent:
        t.lines.append(f"fio absent: {why}; ratios are to the bench's own raw reference only")
    t.lines += [f"{'page':>9} | {'metric':<40} | {'L3':>12} | {'reference':>12} | {'ratio':>6} | {'target':>7} | ok",
                "-" * 110]
    for r in results:
        _spill_rows(t, r)
        _read_reference_rows(t, r)
        for key in [k for k in r if k.startswith("reload_") and k.endswith("_gbps")]:
            _reload_rows(t, r, key[len("reload_"):-len("_gbps")])
        _other_rows(t, r)
        _notes(t, r, gil_pause_page)
    if load:
        s = load["s_per_million"]
        t.row(load["page_bytes"], f"cold_start=load, {load['pages']} live pages", f"{s:.2f}s/Mpg",
              f"{statistics.median(load['open_empty_s']):.2f}s empty", "-", "<=10s", _pass(s <= 10))
    return "\n".join(t.lines)


def _spill_rows(t: Table, r: dict) -> None:
    """Spill against the raw write (the first fill where the bench has one: the raw write fills a file just
    preallocated) and against fio's best write point."""
    p = r["page_bytes"]
    first = "spill_first" if r.get("spill_first_gbps") else "spill"
    label = "spill (first fill)" if first == "spill_first" else "spill"
    q = r[f"{first}_gbps"] / r["raw_write_gbps"]
    t.row(p, f"{label}->durable vs raw O_DIRECT write",
          f"{r[f'{first}_gbps']:.2f}GB/s", f"{r['raw_write_gbps']:.2f}GB/s", f"{q:.2f}x", ">=0.8x", _pass(q >= 0.8))
    t.row(p, "  CPU: spill vs raw write", f"{r[f'{first}_cpu_s_per_gb']:.3f}s/GB",
          f"{r['raw_write_cpu_s_per_gb']:.3f}s/GB", f"{r[f'{first}_cpu_s_per_gb'] / r['raw_write_cpu_s_per_gb']:.2f}x",
          "info", "-")
    fw = r["fio"].get("write")
    if r.get("fio_write_gbps"):
        t.row(p, f"fio best seq write ({fw['iodepth']}x{fw['numjobs']} {fw['engine']})",
              f"{r['fio_write_gbps']:.2f}GB/s", _s_per_gb(r.get("fio_write_cpu_s_per_gb")), "-", "info", "-")
        q = statistics.median(r["spill_vs_fio"])
        t.row(p, "spill->durable vs fio best write", f"{r['spill_gbps']:.2f}GB/s", f"{r['fio_write_gbps']:.2f}GB/s",
              f"{q:.2f}x", ">=0.9x", _pass(q >= 0.9))
        if r.get("fio_write_fresh_gbps") and r.get("spill_first_vs_fio"):
            q = statistics.median(r["spill_first_vs_fio"])
            t.row(p, "  first fill vs fio, one pass, new file", f"{r['spill_first_gbps']:.2f}GB/s",
                  f"{r['fio_write_fresh_gbps']:.2f}GB/s", f"{q:.2f}x", ">=0.9x", _pass(q >= 0.9))
    elif fw:
        t.note(p, f"fio write points failed in every repeat (sweep best {fw['gbps']:.2f}GB/s)")


def _read_reference_rows(t: Table, r: dict) -> None:
    p = r["page_bytes"]
    t.row(p, "raw O_DIRECT read: throughput, CPU", f"{r['raw_read_gbps']:.2f}GB/s",
          f"{r['raw_read_cpu_s_per_gb']:.3f}s/GB", "-", "info", "-")
    if r.get("raw_read_layer_first_gbps"):
        t.row(p, "  same, into the layer-first chunks", f"{r['raw_read_layer_first_gbps']:.2f}GB/s",
              f"{r['raw_read_layer_first_cpu_s_per_gb']:.3f}s/GB",
              f"{r['raw_read_layer_first_gbps'] / r['raw_read_gbps']:.2f}x", "info", "-")
    fr = r["fio"].get("read")
    if r.get("fio_read_gbps"):
        t.row(p, f"fio best rand read ({fr['iodepth']}x{fr['numjobs']} {fr['engine']})",
              f"{r['fio_read_gbps']:.2f}GB/s", _s_per_gb(r.get("fio_read_cpu_s_per_gb")), "-", "info", "-")
    elif fr:
        t.note(p, f"fio read points failed in every repeat (sweep best {fr['gbps']:.2f}GB/s)")


def _reload_rows(t: Table, r: dict, name: str) -> None:
    """One reload pass (``name``: page_first, layer_first, layer_first_single / _vectored) against its references."""
    p, key = r["page_bytes"], f"reload_{name}_gbps"
    layout = "layer_first" if name.startswith("layer_first") else "page_first"
    label = name.replace("_", "-", 1).replace("_", " ")
    paired = r[f"reload_{name}_paired"]
    q = statistics.median(x["gbps_vs_raw"] for x in paired)
    t.row(p, f"reload {label} vs raw read", f"{r[key]:.2f}GB/s", f"{r['raw_read_gbps']:.2f}GB/s",
          f"{q:.2f}x", ">=0.95x", _pass(q >= 0.95))
    if r.get(f"reload_{name}_vs_fio"):
        q = statistics.median(r[f"reload_{name}_vs_fio"])
        t.row(p, "  vs fio best rand read", f"{r[key]:.2f}GB/s", f"{r['fio_read_gbps']:.2f}GB/s", f"{q:.2f}x",
              ">=0.9x", _pass(q >= 0.9))
    if all("gbps_vs_raw_in_place" in x for x in paired):
        q = statistics.median(x["gbps_vs_raw_in_place"] for x in paired)
        t.row(p, "  vs raw read into the same chunks", f"{r[key]:.2f}GB/s",
              f"{r['raw_read_layer_first_gbps']:.2f}GB/s", f"{q:.2f}x", "info", "-")
    q = statistics.median(x["gbps_vs_raw_xxh3"] for x in paired)
    t.row(p, "  vs raw read + xxh3 in place", f"{r[key]:.2f}GB/s",
          f"{r[f'raw_read_xxh3_{layout}_gbps']:.2f}GB/s", f"{q:.2f}x", "info", "-")
    c, ref = r[f"reload_{name}_cpu_s_per_gb"], r[f"raw_read_xxh3_{layout}_cpu_s_per_gb"]
    q = statistics.median(x["cpu_vs_raw_xxh3"] for x in paired)
    t.row(p, "  CPU: vs raw read + xxh3 in place", f"{c:.3f}s/GB", f"{ref:.3f}s/GB", f"{q:.2f}x",
          "<=1.2x", _pass(q <= 1.2))


def _other_rows(t: Table, r: dict) -> None:
    """Batched exists, peak staging against its cap, and SGLang's HiCacheFile backend as a reference."""
    p = r["page_bytes"]
    e = r["exists_us_per_page"]
    t.row(p, "batched exists (128/call)", f"{e:.2f}us/pg", "-", "-", "<=20us", _pass(e <= 20))
    q = r["staging_peak_bytes"] / r["staging_cap_bytes"]
    t.row(p, "peak staging vs cap", f"{r['staging_peak_bytes'] / 2**20:.0f}MiB",
          f"{r['staging_cap_bytes'] / 2**20:.0f}MiB", f"{q:.2f}x", "<=1.0x", _pass(q <= 1.0))
    hf = r["hicache_file"]
    if isinstance(hf, dict):
        t.row(p, "HiCacheFile write+os.sync (ref)", f"{r['spill_gbps']:.2f}GB/s", f"{hf['write_gbps']:.2f}GB/s",
              f"{r['spill_gbps'] / hf['write_gbps']:.2f}x", "info", "L3/HiCacheFile")
        rl = r["reload_page_first_gbps"]
        t.row(p, "HiCacheFile read, DONTNEED (ref)", f"{rl:.2f}GB/s", f"{hf['read_gbps']:.2f}GB/s",
              f"{rl / hf['read_gbps']:.2f}x", "info", "L3/HiCacheFile")
    else:
        t.note(p, hf)


def _notes(t: Table, r: dict, gil_pause_page: int) -> None:
    """What the rows were measured with: read mode, threads, coalescing, GIL pauses, I/O mode, alignment."""
    fw, fr = r["fio"].get("write"), r["fio"].get("read")
    t.note("", f"layer-first default read: {r['layer_first_default']} ([queues] layer_first_reads = "
               f"\"vectored\" | \"single\"; where both rows are printed, take the mode that meets your targets)")
    helpers, below = r.get("hash_helpers"), r.get("hand_off_below")
    hashing = "on the reading threads" if helpers is None or (below is not None and r["reload_threads"] >= below) \
        else f"on the caller's thread + up to {helpers} helper(s), readers never wait on them"
    best = ", ".join(f"{k} {x['iodepth']}x{x['numjobs']} = {x['iodepth'] * x['numjobs']} in flight"
                     for k, x in (("write", fw), ("read", fr)) if x) or "-"
    t.note("", f"store threads: io_threads={r['io_threads']} (writes in flight), reload_threads="
               f"{r['reload_threads']} (reads in flight), checksums {hashing}; fio best: {best}")
    if r.get("pages_per_transfer"):
        per = ", ".join(f"{k.replace('_', '-')} {v:.1f}" for k, v in r["pages_per_transfer"].items())
        t.note("", f"reload pages per transfer: {per} (adjacent slots read together up to [queues] "
                   f"read_coalesce_bytes = {r.get('read_coalesce_bytes')} B)")
    if r.get("layer_first_gil_pause_bytes") is not None:
        g = r["layer_first_gil_pause_bytes"]
        when = ("never" if g == 0 else "at each page's end" if g >= gil_pause_page
                else f"every {g} B and at each page's end")
        t.note("", f"layer-first checksums give the GIL up {when} ([queues] layer_first_gil_pause)")
    t.note("", f"io_mode={r['io_mode']} pages={r['pages']} layers={r['layers']} spill retries "
               f"(staging full)={r['spill_retries']} dio={r['dio_alignment']} raw reads in place={r['raw_mode']}")
