"""L3's patches of SGLang: none yet. The HiCache storage backend (the wiring behind --enable-cp-l3) adds them here,
each as `Patch(feature=FEATURE, ...)`; until then the feature is declared unavailable (l3/feature.py)."""

from __future__ import annotations

from ..declare import Patch

PATCHES: tuple[Patch, ...] = ()
