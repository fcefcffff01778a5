"""Issue 20, item 7: what SGLang's write-back acknowledgement means, through SGLang's own controller, with a SIGKILL
right after it.

The backend answers SGLang's ``batch_set`` either once the pages are staged (``ack = "write_behind"``, the default:
the fork's GATHER ack, host memory can be released; durable milliseconds later) or once they are durable
(``ack = "durable"``). A child process writes pages back through SGLang's backup thread on a slow disk, records
what SGLang was answered, and SIGKILLs itself as soon as SGLang drained the acknowledgements. After a ``load``
restart: under write-behind the window shows (some acknowledged pages are misses -- never wrong bytes -- and no more
than the acknowledged-not-durable gauge said at the kill); under ``durable`` nothing acknowledged is lost.
"""

import json
import os
import signal

import pytest

from l3kit import write_config

pytestmark = pytest.mark.usefixtures("standins", "sglang_state")  # its stacks publish server args

CHILD = os.path.join(os.path.dirname(__file__), "ack_kill_child.py")
PAGES = 6


def _stack(cfg):
    from sglang_glm_ext.l3.demo import stack

    spec = stack.StackSpec(layers=2, device_pages=4 * PAGES)
    sa = stack.publish_server_args(spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
                                   plugin_values={"enable_cp_l3": True, "cp_l3_config": cfg})
    return stack.DsaStack.build(spec, sa)


@pytest.mark.slow
@pytest.mark.parametrize("ack", ["write_behind", "durable"])
def test_a_sigkill_right_after_sglangs_ack_loses_only_the_write_behind_window(sglang_python, tmp_path, ack):
    cfg = write_config(tmp_path, cold_start="load", ack=ack)
    out = tmp_path / "child.json"
    # the child: a process of its own, forked from a parent that imported SGLang only; it SIGKILLs itself
    proc = sglang_python.run(path=CHILD, argv=[cfg, out, PAGES, "0.25"], env=dict(os.environ), timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-4000:]
    rec = json.loads(out.read_text())
    assert rec["ack"] == ack and len(rec["acked"]) == PAGES  # SGLang was told every page is stored
    from sglang_glm_ext.l3.hicache.keys import storage_key

    st = _stack(cfg)  # the restart: cold_start = "load"
    try:
        store, kind = st.backend.store, st.backend.plan.kv.kind
        durable = [store.exists(kind, [storage_key(k)], include_staged=False) == 1 for k in rec["acked"]]
        lost = durable.count(False)
        loaded = st.prefetch(rec["tokens"], "after-kill")  # through SGLang: the prefix it finds in L3
        print(f"ack={ack}: SGLang acked {len(rec['acked'])} pages in {rec['ack_s']:.2f} s; at the kill "
              f"{rec['acked_not_durable_pages']} acked-not-durable ({rec['acked_not_durable_bytes']} B, oldest "
              f"{rec['acked_not_durable_oldest_s']:.3f} s); after the restart {lost} lost, {loaded} tokens loaded")
        if ack == "durable":
            assert rec["acked_not_durable_pages"] == 0 and rec["durable_at_ack"] == PAGES
            assert lost == 0 and loaded == len(rec["tokens"])  # nothing acknowledged is lost
        else:
            # The window: acknowledged before durable (the gauge said so at the kill), lost by the kill, and
            # bounded by what the gauge showed; the restart serves misses, never wrong bytes.
            assert rec["acked_not_durable_pages"] > 0 and rec["acked_not_durable_oldest_s"] > 0
            assert 0 < lost <= rec["acked_not_durable_pages"]
            assert loaded < len(rec["tokens"])
            assert store.stats()["verify_failures"] == 0
    finally:
        st.close()
