"""The plugin machinery: what every feature shares, on top of the feature folders.

`register.register()` is what SGLang's entry point runs; `compat` is the one version guard; `registry` lists the
features and concatenates their patch declarations into the ledger; `flags` parses, validates and carries the
plugin's flag values on ServerArgs (`hooks` are the guard patches SGLang calls); `doctor`, `docs` and `cli` are
what users run. Carries no seed lines of its own (plugin infrastructure).
"""

__version__ = "0.1.0"
