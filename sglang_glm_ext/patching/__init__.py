"""The patch ledger: how the plugin applies and verifies its changes to SGLang.

Declarations live with their features (`<feature>/patches.py`, concatenated in order by `plugin/registry.py`);
this package holds the machinery, which takes the patch list as input: `ledger.py` (the apply/verify loop and
each patch's version check), `contract.py` (each target still as the hook expects it in the installed SGLang),
`manifest.py` (docs_internal/patch_manifest.md).
"""
