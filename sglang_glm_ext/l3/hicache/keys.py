"""Storage keys and namespaces for SGLang's HiCache calls. Pure: no SGLang, no torch.

Keys. SGLang hands a backend string keys: normally a page's SHA-256 chain as 64 lower-case hex chars
(``srt/mem_cache/utils.py`` ``get_hash_str``, seeded with ``extra_key`` / ``cache_salt``), but its own fixtures and
other callers use anything ("h0", "page-a"). The engine wants 32 bytes. :func:`storage_key` is injective on
strings: canonical lower-case hex is decoded as is (so an L3 blob header names the page SGLang named), anything
else is hashed under a domain tag (a collision with a hex key would need a BLAKE2b-256 preimage).

Namespaces. Two deployments whose bytes mean different things must never read each other's pages, even on one
disk and one index. :class:`NamespaceSpec` lists every field that changes what a page's bytes mean, and
:meth:`NamespaceSpec.to_namespace` folds all of them but the deployment into the engine's ``format.Namespace``;
the store binds the deployment itself (``Namespace.digest_for(deployment_id)``: in every blob header and
index key), so it is counted once, there. :meth:`NamespaceSpec.sealed_digest` is that digest. SGLang's
``HiCacheStorageConfig`` (0.5.23) carries no KV dtype (TODO in ``srt/mem_cache/hicache_storage.py``, SGLang issue
#33268): the plugin supplies it (``hooks.py``).

Sidecar draft pools (``DRAFT``, ``DRAFT_INDEXER``) are not in the namespace: SGLang may register them after the
store opened, and the namespace must be the same either way. Their byte format binds their keys instead
(:func:`pool_tag`, :func:`pool_keys`): a page written under another draft format is never found.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

__all__ = ["storage_key", "storage_keys", "pool_tag", "pool_keys", "PoolFormat", "ShardIdentity", "NamespaceSpec"]

_HEX64 = re.compile(r"[0-9a-f]{64}")
_PERSON = b"glm-l3-strkey"
_POOL_PERSON = b"glm-l3-pool"


def storage_key(key) -> bytes:
    """32 raw bytes for one SGLang key. Injective over str; bytes of length 32 pass through."""
    if isinstance(key, str):
        if len(key) == 64 and _HEX64.fullmatch(key):
            return bytes.fromhex(key)
        raw = key.encode("utf-8", "surrogatepass")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        raw = bytes(key)
        if len(raw) == 32:
            return raw
    else:
        raise TypeError(f"HiCache storage key must be str or bytes, got {type(key).__name__}")
    return hashlib.blake2b(raw, digest_size=32, person=_PERSON).digest()


def storage_keys(keys) -> list[bytes]:
    return [storage_key(k) for k in keys]


def pool_tag(fmt: "PoolFormat") -> bytes:
    """16 bytes naming a pool's byte format (every field of its PoolFormat), for :func:`pool_keys`."""
    doc = json.dumps(asdict(fmt), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(doc, digest_size=16, person=_POOL_PERSON).digest()


def pool_keys(raw_keys: list[bytes], tag: "bytes | None") -> list[bytes]:
    """The page keys of a pool whose format is bound through its keys (``tag`` from :func:`pool_tag`): a keyed
    BLAKE2b-256 of each 32-byte key; ``tag`` None: the keys as they are."""
    if tag is None:
        return raw_keys
    return [hashlib.blake2b(k, digest_size=32, key=tag).digest() for k in raw_keys]


@dataclass(frozen=True)
class PoolFormat:
    """One served host pool's page byte format, as decided at attach (see ``pool_plans.py``)."""

    pool: str            # SGLang PoolName value: kv, indexer, draft, draft_indexer
    family: str          # mla | dsa_indexer | mha
    layout: str          # SGLang host layout the payload order follows
    page_bytes: int
    layers: int          # host layers in one page (target + packed draft)
    draft_layers: int    # packed NextN draft layers among them
    detail: str = ""     # geometry that fixes the byte order (row widths, item sizes)


@dataclass(frozen=True)
class ShardIdentity:
    """Which slice of the model state this rank's pages hold.

    Replicated pools (MLA / DSA: every TP rank holds the same latent KV) name no TP rank, so any rank reads what
    the writer wrote; MHA KV is split by heads, so its TP shard is part of it. Pipeline stages hold different
    layers (also in the layer range). Decode-context-parallel ranks hold disjoint token slices of a page.
    Attention-DP replicas of the same shard hold the same bytes and share pages on purpose, and so do attention-CP
    ranks: DSA all-gathers the KV before it is saved, so CP ranks are replicas (one owner writes each page,
    ``cp_writers.py``); no CP rank here. Except under DSA cache layer split, where CP rank ``r`` of ``N`` holds its
    own layers of every page: ``layer_shard_rank`` / ``layer_shard_size`` name that part (its layer range is the
    namespace's ``layer_start`` / ``layer_end``), so two parts never share a digest even when their byte counts
    match. ``kv_shard_size``: the KV-sharding group a page's holder is chosen in (no rank: the holder of a page
    changes with the chain's rotation, ``parts.kv_stripe``; the page's bytes are the whole page on every holder).
    Every field left at its default adds nothing to :meth:`tag`, so existing namespaces keep their digests.
    """

    replicated: bool
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    dcp_rank: int = 0
    dcp_size: int = 1
    layer_shard_rank: int = 0
    layer_shard_size: int = 1
    kv_shard_size: int = 1

    def tag(self) -> str:
        parts = ["replicated" if self.replicated else f"tp{self.tp_rank}of{self.tp_size}",
                 f"pp{self.pp_rank}of{self.pp_size}"]
        if self.dcp_size > 1:
            parts.append(f"dcp{self.dcp_rank}of{self.dcp_size}")
        if self.layer_shard_size > 1:
            parts.append(f"lsplit{self.layer_shard_rank}of{self.layer_shard_size}")
        if self.kv_shard_size > 1:
            parts.append(f"kvshard{self.kv_shard_size}")
        return "-".join(parts)


@dataclass(frozen=True)
class NamespaceSpec:
    """Everything that must match for a stored page to be meaningful to this reader."""

    deployment_id: str
    model: str                 # SGLang's storage model name (served model name + host pool format tag)
    kv_dtype: str              # logical KV dtype (float8_e4m3fn and float8_e5m2 are both uint8 on the host)
    host_layout: str           # --hicache-mem-layout
    page_size: int             # tokens per page
    layer_start: int           # the model layers this rank stores [start, end): its stage, or its layer-split part
    layer_end: int
    pools: tuple[PoolFormat, ...]
    shard: ShardIdentity
    extra: tuple[tuple[str, str], ...] = field(default=())  # seams (CP, future formats): sorted (key, value)

    def to_namespace(self):
        from ..disk.format import Namespace

        layout = json.dumps({"host_layout": self.host_layout, "pools": [asdict(p) for p in self.pools],
                             "extra": list(self.extra)}, sort_keys=True, separators=(",", ":"))
        # The deployment is not folded in here: the store's digest_for(deployment_id) binds it (counted once).
        # Namespace refuses an empty model; an unnamed model is still a value of its own.
        return Namespace(model=self.model or "<unnamed>", kv_dtype=self.kv_dtype, layout=layout,
                         page_size=self.page_size, layer_start=self.layer_start, layer_end=self.layer_end,
                         shard=self.shard.tag())

    def sealed_digest(self) -> bytes:
        """What every blob of this namespace is sealed with and checked against, and the index key's namespace
        part: the engine's ``digest_for`` of the deployment over :meth:`to_namespace`."""
        return self.to_namespace().digest_for(self.deployment_id)

    def describe(self) -> dict:
        out = asdict(self)
        out["shard"] = self.shard.tag()
        out["digest"] = self.sealed_digest().hex()
        return out
