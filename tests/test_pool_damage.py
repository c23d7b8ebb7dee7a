"""Pool damage that keeps every chunk intact but puts data in the wrong place (issue 32): a chunk file
copied over another, the token arrays of pi and mu swapped, a scorer's directory renamed to another's,
tokens rewritten under draws scored on the old ones, a commit marker that lies, garbage array metadata.
Each is refused with a PoolError naming the place (array, rows, passes, marker file). Format-2 pools
(markers without manifests) still load, with a warning, and a writer resuming one keeps format 2.

The pool is test_pools' finished campaign: N = 10 rows in chunks of 4 (0:4, 4:8, 8:10), R = 4 passes
in chunks of 1, scorers vllm and sglang, top-k 3, sample log-probs; one tokens shard per side, one
draws shard per (side, scorer, pass) over all rows.
"""

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import test_pools as base
import zarr
from test_pools import N, R, assert_campaign, chunk_file, engine_data, n, run_campaign, stopping_rows, stopping_writer

from tvjax.pools.store import (
    FORMAT_VERSION,
    PoolError,
    coverage,
    create_pool,
    draws_key,
    load_pool,
    open_pool_writer,
    pad_stopped,
    read_lengths,
    read_tokens,
    tokens_key,
)

pristine, pool = base.pristine, base.pool  # the finished campaign above, copied per test
TOKENS, DRAWS = tokens_key("pi", 0, N), draws_key("mu", "sglang", 0, N, 1, 2)  # two markers of it


def marker(path, key):
    return Path(path, "commits", f"{key}.json")


def edit_marker(path, name, fields):
    """Rewrite fields of the commit marker `name` in place (None deletes a field)."""
    rec = json.loads(marker(path, name).read_text())
    for k, v in fields.items():
        if v is None:
            rec.pop(k, None)
        else:
            rec[k] = v
    marker(path, name).write_text(json.dumps(rec))


def swap(a, b):
    """Swap two directories of a pool by renaming them."""
    a.rename(a.with_name(a.name + ".swap"))
    b.rename(a)
    a.with_name(a.name + ".swap").rename(b)


def place(path, name, rows, passes, key):
    """The message naming a piece of `name` that is not what marker `key` wrote there."""
    where = f"rows {rows}" + ("" if passes is None else f" passes {passes}")
    return (re.escape(f"pool {path}: {name} ") + r"([^;]*; )*?(rows [^;]*, )?" + re.escape(where) + "[^;]*"
            + re.escape(f"do not match their commit marker commits/{key}.json") + ".*" + re.escape("(data moved or overwritten)"))


def to_format_2(path):
    """What a pool written by a version-2 tvjax looks like: markers without manifest and tokens, version 2."""
    for f in Path(path, "commits").glob("*.json"):
        rec = json.loads(f.read_text())
        rec.pop("manifest"), rec.pop("tokens", None)
        f.write_text(json.dumps(rec))
    group = zarr.open_group(str(path), mode="r+")
    group.attrs["format_version"] = 2
    group.attrs["metadata"] = {**group.attrs["metadata"], "format_version": 2}


def test_undamaged_pool_loads_identically_and_its_markers_hold_manifests(pool):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a current pool loads without a warning
        loaded = load_pool(pool)
        assert_campaign(loaded)
        assert_campaign(load_pool(pool, partial=True))
        np.testing.assert_array_equal(read_tokens(pool, "mu"), engine_data()[0]["mu"])
        assert read_lengths(pool, "pi").tolist() == [n] * N
        only = load_pool(pool, scorers=("sglang",), load_topk=False)
    assert loaded.metadata["format_version"] == FORMAT_VERSION == 3 and only.topk_ids is None
    np.testing.assert_array_equal(only.logprobs["pi"]["sglang"], engine_data()[1][("pi", "sglang")])
    tokens = json.loads(marker(pool, tokens_key("pi", 0, N)).read_text())
    assert sorted(tokens["manifest"]) == ["sample_logprobs/pi", "tokens/pi"]
    assert [p["rows"] for p in tokens["manifest"]["tokens/pi"]] == [[0, 4], [4, 8], [8, 10]]
    draws = json.loads(marker(pool, draws_key("mu", "vllm", 0, N, 2, 3)).read_text())
    assert sorted(draws["manifest"]) == ["logprobs/mu/vllm", "topk_ids/mu/vllm", "topk_logprobs/mu/vllm"]
    assert draws["manifest"]["logprobs/mu/vllm"][1]["passes"] == [2, 3] and list(draws["tokens"]) == ["tokens.mu.r0-10"]


# (array, chunk copied, chunk overwritten, rows and passes of the overwritten piece, its marker)
COPIES = [("tokens/mu", (1, 0), (2, 0), "8:10", None, tokens_key("mu", 0, N)),
          ("sample_logprobs/pi", (0, 0), (1, 0), "4:8", None, tokens_key("pi", 0, N)),
          ("logprobs/pi/sglang", (1, 0, 2), (2, 0, 2), "8:10", "2:3", draws_key("pi", "sglang", 0, N, 2, 3)),
          ("logprobs/mu/vllm", (0, 0, 1), (0, 0, 3), "0:4", "3:4", draws_key("mu", "vllm", 0, N, 3, 4)),
          ("topk_ids/mu/sglang", (2, 0, 0, 0), (1, 0, 0, 0), "4:8", "0:1", draws_key("mu", "sglang", 0, N, 0, 1)),
          ("topk_logprobs/pi/vllm", (0, 0, 1, 0), (0, 0, 2, 0), "0:4", "2:3", draws_key("pi", "vllm", 0, N, 2, 3))]


@pytest.mark.parametrize("name,source,target,rows,passes,key", COPIES)
def test_chunk_file_copied_over_another_is_named(pool, name, source, target, rows, passes, key):
    shutil.copyfile(chunk_file(pool, name, source), chunk_file(pool, name, target))  # valid crc32c, wrong place
    with pytest.raises(PoolError, match=place(pool, name, rows, passes, key)):
        load_pool(pool)
    with pytest.raises(PoolError, match=place(pool, name, rows, passes, key)):
        load_pool(pool, partial=True)
    if name == "tokens/mu":
        np.testing.assert_array_equal(read_tokens(pool, "pi"), engine_data()[0]["pi"])
        with pytest.raises(PoolError, match=place(pool, name, rows, passes, key)):
            read_tokens(pool, "mu")


def test_swapped_token_arrays_are_named(pool):
    swap(pool / "tokens" / "pi", pool / "tokens" / "mu")
    with pytest.raises(PoolError, match=re.escape(f"pool {pool}: tokens/pi rows 0:10 do not match their commit marker "
                                                  f"commits/{TOKENS}.json (data moved or overwritten)")):
        load_pool(pool)
    with pytest.raises(PoolError, match=place(pool, "tokens/mu", "0:10", None, tokens_key("mu", 0, N))):
        read_tokens(pool, "mu")


def test_renamed_scorer_directory_is_named(pool):
    shutil.rmtree(pool / "logprobs" / "pi" / "sglang")
    (pool / "logprobs" / "pi" / "vllm").rename(pool / "logprobs" / "pi" / "sglang")
    with pytest.raises(PoolError, match="array logprobs/pi/vllm is missing from the pool"):
        load_pool(pool)
    # without vllm the renamed directory would load as sglang's draws: its markers say otherwise
    with pytest.raises(PoolError, match=place(pool, "logprobs/pi/sglang", "0:10", "0:1", draws_key("pi", "sglang", 0, N, 0, 1))):
        load_pool(pool, scorers=("sglang",))


@pytest.mark.parametrize("family", ["logprobs", "topk_logprobs"])
def test_swapped_scorer_directories_are_named(pool, family):
    swap(pool / family / "mu" / "vllm", pool / family / "mu" / "sglang")
    with pytest.raises(PoolError, match=place(pool, f"{family}/mu/vllm", "0:10", "0:1", draws_key("mu", "vllm", 0, N, 0, 1))):
        load_pool(pool)
    with pytest.raises(PoolError, match=place(pool, f"{family}/mu/sglang", "0:10", "0:1",
                                              draws_key("mu", "sglang", 0, N, 0, 1))):
        load_pool(pool, scorers=("sglang",))


# (marker, edit, what the error says about it)
LIES = [(TOKENS, {"rows": [16, 200]}, "claims rows [16, 200]: not a non-empty range within [0, 10]"),
        (TOKENS, {"rows": [4, 4]}, "claims rows [4, 4]: not a non-empty range"),
        (TOKENS, {"rows": [0, 4]}, "holds key 'tokens.pi.r0-10', but its fields make 'tokens.pi.r0-4'"),
        (TOKENS, {"side": "mu"}, "holds key 'tokens.pi.r0-10', but its fields make 'tokens.mu.r0-10'"),
        (TOKENS, {"side": "nu"}, "has unknown side 'nu'"),
        (TOKENS, {"kind": "logits"}, "has unknown kind 'logits'"),
        (TOKENS, {"rows": [0, 10.0]}, "claims rows [0, 10.0]"),
        (TOKENS, {"side": None}, "lacks the fields ['side']"),
        (TOKENS, {"manifest": None}, "has no manifest of the arrays ['tokens/pi', 'sample_logprobs/pi']"),
        (TOKENS, {"manifest": {"tokens/pi": [], "sample_logprobs/pi": []}},
         "has a manifest of tokens/pi that does not describe its shard's pieces"),
        (DRAWS, {"passes": [1, 9]}, "claims passes [1, 9]: not a non-empty range within [0, 4]"),
        (DRAWS, {"passes": "all"}, "claims passes 'all'"),
        (DRAWS, {"scorer": "hf", "key": draws_key("mu", "hf", 0, N, 1, 2)}, "names scorer 'hf', not one of the pool's"),
        (DRAWS, {"tokens": None}, "names no tokens shards it scored"),
        (DRAWS, {"tokens": {"tokens.pi.r0-10": "0" * 32}}, "names 'tokens.pi.r0-10' among the tokens it scored"),
        (DRAWS, {"tokens": {"tokens.mu.r0-4": "0" * 32}}, "names tokens shards ['tokens.mu.r0-4'] that do not cover"),
        (DRAWS, {"scorer": None}, "lacks the fields ['scorer']")]


@pytest.mark.parametrize("key,edit,says", LIES)
def test_lying_commit_marker_is_named(pool, key, edit, says):
    edit_marker(pool, key, edit)
    message = re.escape(f"pool {pool}: commit marker commits/{key}.json {says}")
    for attempt in (lambda: load_pool(pool), lambda: load_pool(pool, partial=True), lambda: coverage(pool),
                    lambda: read_tokens(pool, "mu"), lambda: open_pool_writer(pool)):
        with pytest.raises(PoolError, match=message):
            attempt()


def test_unreadable_and_misnamed_markers_are_named(pool):
    text = marker(pool, TOKENS).read_text()
    marker(pool, TOKENS).write_text(text[:len(text) // 2])  # truncated
    with pytest.raises(PoolError, match=re.escape(f"pool {pool}: unreadable commit marker commits/{TOKENS}.json")):
        load_pool(pool)
    marker(pool, TOKENS).write_text("[1, 2]")
    with pytest.raises(PoolError, match=re.escape(f"commit marker commits/{TOKENS}.json is not a JSON object")):
        load_pool(pool)
    marker(pool, TOKENS).write_text(text)
    mu = marker(pool, tokens_key("mu", 0, N)).read_text()
    shutil.copyfile(marker(pool, TOKENS), marker(pool, tokens_key("mu", 0, N)))  # pi's marker as mu's
    with pytest.raises(PoolError, match=re.escape("commit marker commits/tokens.mu.r0-10.json holds key "
                                                  "'tokens.pi.r0-10', not its file name")):
        load_pool(pool)
    marker(pool, tokens_key("mu", 0, N)).write_text(mu)
    shutil.copyfile(marker(pool, TOKENS), marker(pool, tokens_key("mu", 0, N)).with_name("tokens.pi.r0-10 (copy).json"))
    with pytest.raises(PoolError, match=re.escape("commit marker commits/tokens.pi.r0-10 (copy).json holds key")):
        load_pool(pool)


def test_overlapping_markers_are_named(pool):
    rec = json.loads(marker(pool, TOKENS).read_text())
    key = tokens_key("pi", 0, 4)  # a well-formed marker of rows 0:4 beside the one of rows 0:10
    rec.update(key=key, rows=[0, 4], manifest={k: v[:1] for k, v in rec["manifest"].items()})
    marker(pool, key).write_text(json.dumps(rec))
    with pytest.raises(PoolError, match=re.escape(f"commit marker commits/{key}.json overlaps commits/{TOKENS}.json")):
        load_pool(pool)


def test_wrong_checksum_in_a_marker_is_named(pool):
    rec = json.loads(marker(pool, DRAWS).read_text())
    rec["manifest"]["topk_ids/mu/sglang"][2]["crc32"] ^= 1
    marker(pool, DRAWS).write_text(json.dumps(rec))
    with pytest.raises(PoolError, match=place(pool, "topk_ids/mu/sglang", "8:10", "1:2", DRAWS)):
        load_pool(pool)
    np.testing.assert_array_equal(load_pool(pool, load_topk=False).logprobs["mu"]["sglang"],
                                  engine_data()[1][("mu", "sglang")])


@pytest.mark.parametrize("garbage", ["{not json", "{}", '{"zarr_format": 3, "node_type": "array"}'])
def test_garbage_array_metadata_is_named(pool, garbage):
    (pool / "logprobs" / "mu" / "vllm" / "zarr.json").write_text(garbage)
    with pytest.raises(PoolError, match=re.escape("array logprobs/mu/vllm: unreadable metadata (logprobs/mu/vllm/zarr.json)")):
        load_pool(pool)
    (pool / "tokens" / "pi" / "zarr.json").write_text(garbage)
    with pytest.raises(PoolError, match=re.escape("array tokens/pi: unreadable metadata (tokens/pi/zarr.json)")):
        read_tokens(pool, "pi")


def test_garbage_array_metadata_refuses_a_write(tmp_path):
    writer = create_pool(tmp_path / "p", n=n, num_per_side=N, repeats=R)
    (tmp_path / "p" / "tokens" / "mu" / "zarr.json").write_text("{not json")
    with pytest.raises(PoolError, match=re.escape("array tokens/mu: unreadable metadata")):
        writer.write_tokens("mu", 0, engine_data()[0]["mu"])
    assert not writer.done_shards()


def test_tokens_rewritten_under_their_draws_are_refused(pool):
    # the tokens marker lost and the side sampled again: the draws were scored on the old tokens
    marker(pool, tokens_key("pi", 0, N)).unlink()
    open_pool_writer(pool).write_tokens("pi", 0, engine_data(seed=1)[0]["pi"], sample_logprobs=np.zeros((N, n), np.float32))
    with pytest.raises(PoolError, match=re.escape(f"pool {pool}: draws pi/sglang rows 0:10 passes 0:1 "
                                                  f"(commits/{draws_key('pi', 'sglang', 0, N, 0, 1)}.json) were scored "
                                                  "against other tokens than commits/tokens.pi.r0-10.json now holds")):
        load_pool(pool)


def test_tokens_recommitted_in_other_shards_are_refused(pool):
    marker(pool, tokens_key("pi", 0, N)).unlink()
    writer = open_pool_writer(pool)
    tokens, lp = engine_data()[0]["pi"], np.zeros((N, n), np.float32)
    writer.write_tokens("pi", 0, tokens[:6], sample_logprobs=lp[:6])
    writer.write_tokens("pi", 6, tokens[6:], sample_logprobs=lp[6:])
    with pytest.raises(PoolError, match=re.escape("were scored against tokens shards ['tokens.pi.r0-10'], but rows 0:10 "
                                                  "are committed by other tokens shards now")):
        load_pool(pool)


def partial_pool(path):
    """Rows 0:6 complete (scorer b only has rows 0:6), so a partial load stops inside chunk 1 (rows 4:8)."""
    rng = np.random.default_rng(3)
    writer = create_pool(path, n=n, num_per_side=N, repeats=2, scorers=("a", "b"), row_chunk=4)
    data = {}
    for side in ("pi", "mu"):
        writer.write_tokens(side, 0, rng.integers(0, 9, (N, n)))
        for sc, rows in (("a", N), ("b", 6)):
            data[side, sc] = np.log(rng.random((rows, n, 2))).astype(np.float32)
            writer.write_draws(side, sc, 0, 0, data[side, sc])
    return data


def test_partial_load_checks_the_pieces_it_meets_whole(tmp_path):
    path = tmp_path / "p"
    data = partial_pool(path)
    part = load_pool(path, partial=True)
    assert part.rows["pi"].tolist() == list(range(6))
    np.testing.assert_array_equal(part.logprobs["mu"]["a"], data["mu", "a"][:6])
    shutil.copyfile(chunk_file(path, "logprobs/mu/a", (1, 0, 0)), chunk_file(path, "logprobs/mu/a", (2, 0, 0)))
    load_pool(path, partial=True)  # rows 8:10 are not loaded: their piece is not read
    shutil.copyfile(chunk_file(path, "logprobs/mu/a", (0, 0, 0)), chunk_file(path, "logprobs/mu/a", (1, 0, 0)))
    with pytest.raises(PoolError, match=place(path, "logprobs/mu/a", "4:8", "0:1", draws_key("mu", "a", 0, N, 0, 2))):
        load_pool(path, partial=True)  # rows 4:6 loaded, the piece 4:8 checked whole


def test_draws_come_after_their_tokens_even_from_another_writer(tmp_path):
    first = create_pool(tmp_path / "p", n=n, num_per_side=N, repeats=R)
    draws = np.zeros((N, n, 1), np.float32)
    with pytest.raises(PoolError, match="draws of mu rows 0:10 before their tokens: draws are bound to the tokens"):
        first.write_draws("mu", "pi", 0, 0, draws)
    open_pool_writer(tmp_path / "p").write_tokens("mu", 0, engine_data()[0]["mu"])  # another writer commits them
    key = first.write_draws("mu", "pi", 0, 0, draws)
    assert json.loads(marker(tmp_path / "p", key).read_text())["tokens"].keys() == {"tokens.mu.r0-10"}


def test_swapped_lengths_of_a_stopping_pool_are_named(tmp_path):
    writer = stopping_writer(tmp_path / "p")
    tokens, lengths = stopping_rows()
    other = np.array([[4, 4, 4, 4, 4], [4, 7, 2, 2, 2], [5, 6, 2, 2, 2], [4, 5, 6, 5, 7]], np.int32)
    zeros = np.zeros((4, 5), np.float32)
    for side, (t, ln) in (("pi", (tokens, lengths)), ("mu", (other, np.array([5, 2, 3, 5], np.int32)))):
        writer.write_tokens(side, 0, t, sample_logprobs=zeros, lengths=ln)
        for scorer in ("a", "b"):
            lp, ids, tlp = pad_stopped(ln, 2, np.full((4, 5, 2), -1.0), np.zeros((4, 5, 2, 2), int), np.full((4, 5, 2, 2), -1.0))
            writer.write_draws(side, scorer, 0, 0, lp, ids, tlp)
    assert read_lengths(tmp_path / "p", "mu").tolist() == [5, 2, 3, 5]
    swap(tmp_path / "p" / "lengths" / "pi", tmp_path / "p" / "lengths" / "mu")
    with pytest.raises(PoolError, match=place(tmp_path / "p", "lengths/pi", "0:4", None, "tokens.pi.r0-4")):
        load_pool(tmp_path / "p")
    with pytest.raises(PoolError, match=place(tmp_path / "p", "lengths/mu", "0:4", None, "tokens.mu.r0-4")):
        read_lengths(tmp_path / "p", "mu")


UNCHECKED = "format version 2: its commit markers hold no manifests, so its data's places are unchecked"


def test_format_2_pool_loads_with_a_warning(pool):
    to_format_2(pool)
    with pytest.warns(UserWarning, match=UNCHECKED):
        assert_campaign(load_pool(pool))
    with pytest.warns(UserWarning, match=UNCHECKED):
        np.testing.assert_array_equal(read_tokens(pool, "pi"), engine_data()[0]["pi"])
    with pytest.warns(UserWarning, match=UNCHECKED):
        assert load_pool(pool, partial=True).passes.tolist() == list(range(R))
    shutil.copyfile(chunk_file(pool, "tokens/mu", (1, 0)), chunk_file(pool, "tokens/mu", (2, 0)))
    with pytest.warns(UserWarning, match=UNCHECKED):
        moved = load_pool(pool)  # what the warning says: a format-2 pool cannot see this
    np.testing.assert_array_equal(moved.tokens["mu"][8:10], engine_data()[0]["mu"][4:6])
    edit_marker(pool, TOKENS, {"rows": [16, 200]})  # its markers are checked all the same
    with pytest.raises(PoolError, match=re.escape(f"commit marker commits/{TOKENS}.json claims rows [16, 200]")):
        load_pool(pool)


def test_writer_resuming_a_format_2_pool_keeps_format_2(pool):
    to_format_2(pool)
    lost = draws_key("pi", "sglang", 0, N, 3, 4)
    marker(pool, lost).unlink()  # the campaign was killed before this shard's commit
    with pytest.warns(UserWarning, match="resuming it writes version-2 commit markers too"):
        run_campaign(pool, sample_logprobs=True)
    rec = json.loads(marker(pool, lost).read_text())
    assert "manifest" not in rec and "tokens" not in rec
    assert zarr.open_group(str(pool), mode="r").attrs["format_version"] == 2
    with pytest.warns(UserWarning, match=UNCHECKED):
        assert_campaign(load_pool(pool))
