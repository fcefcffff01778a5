"""The patch ledger: how the plugin declares, applies and verifies its changes to SGLang.

Declarations live in one place, `sglang_glm_ext/patches.py`; this package holds the machinery
(`ledger.py`: the Patch record and the apply/verify loop, `manifest.py`: docs_internal/patch_manifest.md).
"""
