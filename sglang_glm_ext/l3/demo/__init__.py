"""``sglang-glm-ext demo`` (``run.py``) and the CPU HiCache stack under it: SGLang's real controller, radix cache
and host pools on a CPU (``stack.py``, ``pools.py``), one attention-CP rank as a process (``cp_ranks.py``, gloo),
and the demo/test-only stand-ins for SGLang's GPU copy ops (``cpu_standins.py``, ``Tier.DEMO``: never applied by
``register()``, refused where a GPU is visible or a server was launched). The copies themselves are the CPU
serving mode's (``cpu_serve/kernels.py``). Never imported by the serving path."""
