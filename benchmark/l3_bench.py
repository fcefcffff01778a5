"""L3 engine vs raw O_DIRECT on the same disk, same pages, printed as side-by-side ratios.

The benchmark lives in the package (sglang_glm_ext/l3/tools/bench.py) so `sglang-glm-ext l3 bench` works from an
installed wheel too; this script runs it from a checkout: `python benchmark/l3_bench.py --dir /nvme0/x`.
It needs neither torch nor sglang (the HiCacheFile reference row is skipped when sglang is absent).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sglang_glm_ext.l3.tools.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
