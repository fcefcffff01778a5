"""Demo/test-only helpers: CPU stand-ins for SGLang's GPU copy ops and pinned host pools, and a one-rank HiCache
stack driver. Never imported by the serving path."""
