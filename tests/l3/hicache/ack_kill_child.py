"""Child of test_ack_modes.py (not a test module): one scheduler-like process on SGLang's real HiCache stack with the
L3 backend writes pages back through SGLang's own backup thread on a slow disk, waits for SGLang's acknowledgement
(its backup acks drained: the host copies are released), records what SGLang was answered and the store's
acknowledged-not-durable gauges, then SIGKILLs itself at once -- the moment the ack's meaning is tested.

The disk is as slow as it can be without hanging a durable ack: it holds every write until a spill waits for its
pages to be durable (``ack = "durable"``), then takes each in WRITE_DELAY_S. Under write-behind nothing waits, so no
write completes before the kill, however long SGLang's acknowledgement takes on a loaded machine.

    python ack_kill_child.py CONFIG OUT_JSON PAGES WRITE_DELAY_S
"""

import json
import os
import signal
import sys
import threading
import time


def main() -> None:
    cfg, out, pages, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    import sglang_glm_ext

    sglang_glm_ext.register()
    from sglang_glm_ext.l3.demo import cpu_standins, stack

    cpu_standins.install()
    spec = stack.StackSpec(layers=2, device_pages=4 * pages)
    sa = stack.publish_server_args(spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
                                   plugin_values={"enable_cp_l3": True, "cp_l3_config": cfg})
    st = stack.DsaStack.build(spec, sa)
    be = st.backend

    from sglang_glm_ext.l3.engine.staging import StagedPages

    waited_on = threading.Event()  # a spill waits for its pages to be durable: the disk must let them through
    real_wait_finished = StagedPages.wait_finished

    def wait_finished(self, pages, deadline):
        waited_on.set()
        return real_wait_finished(self, pages, deadline)

    StagedPages.wait_finished = wait_finished

    def slow(fd, data, offset):  # durability lags SGLang's acknowledgement: held until waited on, then slow
        waited_on.wait(600)  # a hang guard only: under write-behind the SIGKILL comes first
        time.sleep(delay)
        return os.pwrite(fd, data, offset)

    for kind in list(be.store.diagnostics().kinds()):
        be.store.slab(kind).inject_write_fault(slow)
    answered: list[str] = []
    orig = be.batch_set_v1

    def recording(keys, host_indices, extra_info=None):  # what SGLang's controller was told about each KV page
        ok = orig(keys, host_indices, extra_info)
        answered.extend(k for k, o in zip(keys, ok) if o)
        return ok

    be.batch_set_v1 = recording
    tokens = list(range(1, 1 + pages * 64))
    slots = st.insert(tokens)
    st.fill_device(slots, seed=7)
    t0 = time.monotonic()
    st.write_back_storage(tokens)  # returns once SGLang drained its backup acks (host copies released)
    s = be.store.stats()
    rec = {"acked": answered, "tokens": tokens, "ack_s": time.monotonic() - t0, "ack": be.config.ack,
           "acked_not_durable_pages": s["acked_not_durable_pages"],
           "acked_not_durable_bytes": s["acked_not_durable_bytes"],
           "acked_not_durable_oldest_s": s["acked_not_durable_oldest_s"],
           "durable_at_ack": be.store.exists(be.plan.kv.kind, [bytes.fromhex(k) for k in answered],
                                             include_staged=False)}
    with open(out, "w") as f:
        json.dump(rec, f)
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)  # right after SGLang's acknowledgement


if __name__ == "__main__":
    main()
