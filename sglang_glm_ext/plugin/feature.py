"""The plugin's own feature row, `flags`: plugin flags on SGLang's CLI, Engine(...) and --config YAML (always on).

Its flags are the features' flags (plugin/registry.py collects them); what it owns are the guard patches
(plugin/patches.py) that carry them through SGLang.
"""

from __future__ import annotations

from ..declare import Feature

FEATURE = Feature("flags", "plugin flags on SGLang's CLI, Engine(...) and --config YAML", "-", always_on=True)
