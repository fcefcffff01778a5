"""Storage keys are injective over SGLang's string keys; every namespace field changes the namespace digest."""

import dataclasses
import hashlib

import pytest

from sglang_glm_ext.l3.hicache.keys import NamespaceSpec, PoolFormat, ShardIdentity, storage_key, storage_keys


def test_sglang_page_hash_passes_through_as_its_raw_bytes():
    h = hashlib.sha256(b"tokens").hexdigest()
    assert storage_key(h) == bytes.fromhex(h)


@pytest.mark.parametrize("key", ["page-a", "h0", "", "é", "A" * 64, "0" * 63, "g" * 64, "\udc80"])
def test_arbitrary_strings_map_to_32_bytes(key):
    raw = storage_key(key)
    assert isinstance(raw, bytes) and len(raw) == 32


def test_mapping_is_injective_on_near_miss_keys():
    h = hashlib.sha256(b"x").hexdigest()
    keys = [h, h.upper(), h[:-1] + "g", "page-a", "page-b", "h0", "h1", h + " "]
    assert len(set(storage_keys(keys))) == len(keys)


def test_32_raw_bytes_pass_through_and_other_types_are_refused():
    raw = bytes(range(32))
    assert storage_key(raw) == raw
    assert storage_key(b"short") != b"short"
    with pytest.raises(TypeError):
        storage_key(7)


def _spec(**kw):
    base = dict(
        deployment_id="prod", model="glm-5", kv_dtype="float8_e4m3fn", host_layout="page_first", page_size=64,
        layer_start=0, layer_end=78,
        pools=(PoolFormat("kv", "mla", "page_first", 3274752, 78, 0, "row=656"),
               PoolFormat("indexer", "dsa_indexer", "page_first", 658944, 78, 0, "page_stride=8448")),
        shard=ShardIdentity(replicated=True),
    )
    base.update(kw)
    return NamespaceSpec(**base)


@pytest.mark.parametrize("field,value", [
    ("deployment_id", "staging"),
    ("model", "glm-5-unified-token-major"),
    ("kv_dtype", "float8_e5m2"),
    ("host_layout", "layer_first"),
    ("page_size", 32),
    ("layer_start", 39),
    ("layer_end", 77),
    ("pools", (PoolFormat("kv", "mla", "page_first", 3274752 + 41984, 79, 1, "row=656"),)),
    ("pools", (PoolFormat("kv", "mla", "page_first", 3274752, 78, 0, "row=656"),)),  # no indexer pool
    ("shard", ShardIdentity(replicated=False, tp_rank=1, tp_size=8)),
    ("shard", ShardIdentity(replicated=True, pp_rank=1, pp_size=2)),
    ("shard", ShardIdentity(replicated=True, dcp_rank=1, dcp_size=2)),
    ("extra", (("cp", "rank-free"),)),
])
def test_every_field_changes_the_digest(field, value):
    # The digest blobs are sealed with (and the index key's namespace part): the deployment rides in through the
    # store's digest_for, every other field through the namespace.
    base = _spec().sealed_digest()
    assert _spec(**{field: value}).sealed_digest() != base


def test_the_deployment_is_counted_once_by_the_store_not_again_in_the_namespace():
    from sglang_glm_ext.l3.disk.format import Namespace

    a, b = _spec(), _spec(deployment_id="staging")
    assert a.to_namespace() == b.to_namespace()  # the namespace proper names no deployment...
    assert "prod" not in a.to_namespace().canonical().decode()
    assert a.sealed_digest() == a.to_namespace().digest_for("prod") != b.sealed_digest()  # ...digest_for does
    assert isinstance(a.to_namespace(), Namespace) and a.to_namespace().model == "glm-5"
    assert _spec(model="").to_namespace().model  # an unnamed model is a value too (Namespace refuses "")


def test_packed_draft_layers_change_the_digest_even_at_equal_page_bytes():
    one = PoolFormat("kv", "mla", "page_first", 1000, 4, 0, "row=10")
    other = dataclasses.replace(one, draft_layers=1)
    assert _spec(pools=(one,)).sealed_digest() != _spec(pools=(other,)).sealed_digest()


def test_digest_is_stable_and_described():
    a, b = _spec(), _spec()
    assert a.sealed_digest() == b.sealed_digest()
    d = a.describe()
    assert d["shard"] == "replicated-pp0of1" and len(d["digest"]) == 32 and d["kv_dtype"] == "float8_e4m3fn"
    assert d["digest"] == a.sealed_digest().hex()


def test_a_sidecar_pool_s_format_binds_its_keys():
    from sglang_glm_ext.l3.hicache.keys import pool_keys, pool_tag

    raw = storage_keys(["a", "b"])
    one = PoolFormat("draft", "mla", "page_first", 1000, 1, 0, "row=10")
    tag = pool_tag(one)
    assert pool_keys(raw, None) == raw
    keyed = pool_keys(raw, tag)
    assert len(set(keyed + raw)) == 4 and all(len(k) == 32 for k in keyed)
    assert pool_keys(raw, tag) == keyed  # stable
    for other in (dataclasses.replace(one, layout="layer_first"), dataclasses.replace(one, page_bytes=1001),
                  dataclasses.replace(one, pool="draft_indexer"), dataclasses.replace(one, detail="row=11")):
        assert pool_keys(raw, pool_tag(other)) != keyed
