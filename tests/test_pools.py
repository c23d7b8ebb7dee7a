"""Pool format: round trip, kill-and-resume without duplicate or lost trajectories, precise refusals."""

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr
from numcodecs.zstd import Zstd

from tvjax.pools.store import (
    FORMAT_VERSION,
    PoolError,
    PoolWriter,
    coverage,
    create_pool,
    draws_key,
    load_pool,
    open_pool_writer,
    read_spec,
    read_tokens,
    tokens_key,
)

N, n, R, K = 10, 5, 4, 3
SCORERS = ("vllm", "sglang")


def engine_data(seed=0):
    """Deterministic stand-in for an engine campaign: tokens per side, one block per (side, scorer, pass)."""
    rng = np.random.default_rng(seed)
    tokens = {s: rng.integers(0, 50, (N, n)).astype(np.int32) for s in ("pi", "mu")}
    draws = {(s, sc): np.log(rng.random((N, n, R))).astype(np.float32) for s in ("pi", "mu") for sc in SCORERS}
    ids = {k: rng.integers(0, 50, (N, n, R, K)).astype(np.int32) for k in draws}
    tlp = {k: np.log(rng.random((N, n, R, K))).astype(np.float32) for k in draws}
    draws[("mu", "vllm")][3, 2, :] = -np.inf  # a zero-mass cell survives the round trip
    return tokens, draws, ids, tlp


def run_campaign(path, seed=0, sample_logprobs=False):
    """Engine-style campaign, resumable: tokens, then one pass over all rows at a time."""
    tokens, draws, ids, tlp = engine_data(seed)
    writer = create_pool(path, n=n, num_per_side=N, repeats=R, scorers=SCORERS, top_k=K,
                         sample_logprobs=sample_logprobs, metadata={"engine": "test", "model": "m"}, row_chunk=4,
                         exist_ok=True)
    for side in ("pi", "mu"):
        if not writer.is_done(tokens_key(side, 0, N)):
            slp = draws[(side, SCORERS[0])][:, :, 0] if sample_logprobs else None
            writer.write_tokens(side, 0, tokens[side], sample_logprobs=slp)
        for sc in SCORERS:
            for j in range(R):
                if not writer.is_done(draws_key(side, sc, 0, N, j, j + 1)):
                    k = (side, sc)
                    writer.write_draws(side, sc, 0, j, draws[k][:, :, j:j + 1], ids[k][:, :, j:j + 1],
                                       tlp[k][:, :, j:j + 1])
    return writer


def commit_counts(path):
    """How many committed shards cover each cell (must be exactly 1 everywhere in a finished pool)."""
    counts = {}
    for f in (Path(path) / "commits").glob("*.json"):
        rec = json.loads(f.read_text())
        name = f"{rec['kind']}/{rec['side']}/{rec['scorer']}"
        a, b = rec["rows"]
        shape = (N,) if rec["kind"] == "tokens" else (N, R)
        c = counts.setdefault(name, np.zeros(shape, int))
        if rec["kind"] == "tokens":
            c[a:b] += 1
        else:
            c[a:b, rec["passes"][0]:rec["passes"][1]] += 1
    return counts


def assert_same_pool(p, q):
    for side in ("pi", "mu"):
        np.testing.assert_array_equal(p.tokens[side], q.tokens[side])
        for sc in SCORERS:
            np.testing.assert_array_equal(p.logprobs[side][sc], q.logprobs[side][sc])
            np.testing.assert_array_equal(p.topk_ids[side][sc], q.topk_ids[side][sc])
            np.testing.assert_array_equal(p.topk_logprobs[side][sc], q.topk_logprobs[side][sc])


def assert_campaign(loaded):
    """`loaded` holds the campaign's data (`engine_data`), all of it."""
    tokens, draws, ids, tlp = engine_data()
    for side in ("pi", "mu"):
        np.testing.assert_array_equal(loaded.tokens[side], tokens[side])
        for sc in SCORERS:
            np.testing.assert_array_equal(loaded.logprobs[side][sc], draws[(side, sc)])
            np.testing.assert_array_equal(loaded.topk_ids[side][sc], ids[(side, sc)])
            np.testing.assert_array_equal(loaded.topk_logprobs[side][sc], tlp[(side, sc)])


def test_round_trip(tmp_path):
    run_campaign(tmp_path / "pool")
    pool = load_pool(tmp_path / "pool")
    assert_campaign(pool)
    assert pool.logprobs["mu"]["vllm"].dtype == np.float32 and pool.tokens["pi"].dtype == np.int32
    assert pool.metadata["model"] == "m" and pool.metadata["format_version"] == FORMAT_VERSION
    assert pool.spec.samplers == SCORERS and pool.passes.tolist() == list(range(R))
    assert all((c == 1).all() for c in commit_counts(tmp_path / "pool").values())


KILLER = textwrap.dedent("""
    import os, signal, sys
    import zarr
    sys.path.insert(0, {tests!r})
    import test_pools
    calls = {{"n": 0}}
    original = zarr.Array.__setitem__
    def dying_setitem(self, key, value):
        calls["n"] += 1
        if calls["n"] == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)   # mid-shard: some arrays of the shard written, no commit
        return original(self, key, value)
    zarr.Array.__setitem__ = dying_setitem
    test_pools.run_campaign({path!r})
""")


@pytest.mark.parametrize("kill_at", [2, 9, 20])
def test_killed_campaign_resumes_without_duplicates_or_losses(tmp_path, kill_at):
    path = str(tmp_path / "pool")
    script = KILLER.format(tests=str(Path(__file__).parent), kill_at=kill_at, path=path)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    done_before = open_pool_writer(path).done_shards()
    with pytest.raises(PoolError, match="incomplete pool"):
        load_pool(path)
    run_campaign(path)  # resume: committed shards are skipped, the interrupted one is rewritten
    assert done_before <= open_pool_writer(path).done_shards()
    run_campaign(tmp_path / "reference")
    assert_same_pool(load_pool(path), load_pool(tmp_path / "reference"))
    counts = commit_counts(path)
    assert len(counts) == 2 + 2 * len(SCORERS) and all((c == 1).all() for c in counts.values())


def test_exception_between_write_and_commit_loses_only_that_shard(tmp_path, monkeypatch):
    path = tmp_path / "pool"
    original = PoolWriter._commit
    state = {"commits": 0}

    def failing_commit(self, *args):
        state["commits"] += 1
        if state["commits"] == 5:
            raise RuntimeError("injected crash after the data write, before the commit")
        return original(self, *args)

    monkeypatch.setattr(PoolWriter, "_commit", failing_commit)
    with pytest.raises(RuntimeError, match="injected"):
        run_campaign(path)
    monkeypatch.setattr(PoolWriter, "_commit", original)
    assert len(open_pool_writer(path).done_shards()) == 4
    run_campaign(path)
    run_campaign(tmp_path / "reference")
    assert_same_pool(load_pool(path), load_pool(tmp_path / "reference"))


def test_partial_load_of_committed_shards(tmp_path):
    tokens, draws, ids, tlp = engine_data()
    writer = create_pool(tmp_path / "p", n=n, num_per_side=N, repeats=R, scorers=SCORERS)
    for side in ("pi", "mu"):
        writer.write_tokens(side, 0, tokens[side])
        for sc in SCORERS:
            writer.write_draws(side, sc, 0, 0, draws[(side, sc)][:, :, :2])  # passes 0, 1 of 4
    writer.write_draws("pi", "vllm", 0, 2, draws[("pi", "vllm")][:, :, 2:3])
    with pytest.raises(PoolError) as err:
        load_pool(tmp_path / "p")
    assert "logprobs" not in str(err.value)  # coverage is reported per shard family
    assert "draws/pi/vllm: rows 0:10 x passes 3:4 not committed" in str(err.value)
    assert "draws/mu/sglang: rows 0:10 x passes 2:4 not committed" in str(err.value)
    part = load_pool(tmp_path / "p", partial=True)
    assert part.passes.tolist() == [0, 1] and part.logprobs["pi"]["vllm"].shape == (N, n, 2)
    np.testing.assert_array_equal(part.logprobs["mu"]["sglang"], draws[("mu", "sglang")][:, :, :2])


def test_partial_load_by_rows(tmp_path):
    writer = create_pool(tmp_path / "p", n=n, num_per_side=N, repeats=R, row_chunk=4)
    rng = np.random.default_rng(1)
    for side in ("pi", "mu"):
        writer.write_tokens(side, 0, rng.integers(0, 5, (4, n)))
        for sc in ("pi", "mu"):
            writer.write_draws(side, sc, 0, 0, np.log(rng.random((4, n, R))))
    writer.write_tokens("pi", 4, rng.integers(0, 5, (4, n)))
    part = load_pool(tmp_path / "p", partial=True)
    assert part.rows["pi"].tolist() == [0, 1, 2, 3] and part.passes.size == R
    assert coverage(tmp_path / "p")["tokens/pi"].sum() == 8


def test_refusals_are_precise(tmp_path):
    path = tmp_path / "pool"
    run_campaign(path)
    with pytest.raises(PoolError, match="already exists"):
        create_pool(path, n=n, num_per_side=N, repeats=R, scorers=SCORERS, top_k=K)
    with pytest.raises(PoolError, match="differs from requested"):
        create_pool(path, n=n, num_per_side=N, repeats=R + 1, scorers=SCORERS, top_k=K, exist_ok=True)
    with pytest.raises(PoolError, match=r"metadata mismatch .*model: 'other' vs 'm'"):
        load_pool(path, expect={"model": "other"})
    writer = open_pool_writer(path)
    with pytest.raises(PoolError, match="overlaps committed shard draws.pi.vllm.r0-10.p1-2"):
        writer.write_draws("pi", "vllm", 0, 1, np.zeros((N, n, 1)), np.zeros((N, n, 1, K), int), np.zeros((N, n, 1, K)))
    with pytest.raises(PoolError, match=r"logprobs block: expected shape \(10, 5, 1\), found \(10, 4, 1\)"):
        writer.write_draws("pi", "vllm", 0, 1, np.zeros((N, 4, 1)))
    with pytest.raises(PoolError, match="contains NaN"):
        writer.write_draws("pi", "vllm", 0, 1, np.full((N, n, 1), np.nan))
    with pytest.raises(PoolError, match=r"passes 3:5 out of range 0:4"):
        writer.write_draws("pi", "vllm", 0, 3, np.zeros((N, n, 2)))
    with pytest.raises(PoolError, match="unknown scorer 'hf'"):
        writer.write_draws("pi", "hf", 0, 0, np.zeros((N, n, 1)))
    with pytest.raises(PoolError, match="not a pool"):
        load_pool(tmp_path / "nothing")


def test_truncated_pool_is_refused(tmp_path):
    path = tmp_path / "pool"
    run_campaign(path)
    (path / "commits" / f"{draws_key('mu', 'sglang', 0, N, 2, 3)}.json").unlink()
    with pytest.raises(PoolError, match=r"^incomplete pool: draws/mu/sglang: rows 0:10 x passes 2:3 not committed$"):
        load_pool(path)


def test_damaged_chunks_and_mismatched_arrays_are_refused(tmp_path):
    path = tmp_path / "pool"
    run_campaign(path)
    chunk = next((path / "logprobs" / "pi" / "sglang" / "c").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    chunk.unlink()  # a committed chunk file lost on disk reads back as the NaN fill value
    with pytest.raises(PoolError, match="array logprobs/pi/sglang: committed region holds NaN"):
        load_pool(path)
    run_campaign(tmp_path / "p2")
    group = zarr.open_group(str(tmp_path / "p2"), mode="r+")
    group.create_array("logprobs/pi/vllm", shape=(N, n, R - 1), dtype="float32", overwrite=True)
    with pytest.raises(PoolError, match=r"array logprobs/pi/vllm: expected shape \(10, 5, 4\) float32, "
                                        r"found \(10, 5, 3\) float32"):
        load_pool(tmp_path / "p2")


def test_format_version_mismatch_is_refused(tmp_path):
    path = tmp_path / "pool"
    run_campaign(path)
    zarr.open_group(str(path), mode="r+").attrs["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(PoolError, match=f"pool format version {FORMAT_VERSION + 1}, this tvjax reads version {FORMAT_VERSION}"):
        read_spec(path)


def test_pools_module_imports_no_jax():
    code = "import sys, tvjax.pools.store; assert not any(m == 'jax' or m.startswith('jax.') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# one chunk of every kind of array (row_chunk=4, pass_chunk=1): name, chunk grid coordinates, what it covers
CHUNKS = [("tokens/mu", (1, 0), "rows 4:8"),
          ("sample_logprobs/pi", (2, 0), "rows 8:10"),
          ("logprobs/pi/sglang", (1, 0, 2), "rows 4:8, passes 2:3"),
          ("topk_ids/mu/vllm", (0, 0, 3, 0), "rows 0:4, passes 3:4"),
          ("topk_logprobs/pi/vllm", (2, 0, 1, 0), "rows 8:10, passes 1:2")]


def chunk_file(path, name, coords):
    return Path(path, name, "c", *map(str, coords))


def damage(file, how):
    """Truncate, flip the middle byte, delete, or overwrite with garbage one chunk file."""
    data = bytearray(file.read_bytes())
    if how == "truncate":
        file.write_bytes(data[:len(data) // 2])
    elif how == "flip":
        data[len(data) // 2] ^= 0xFF
        file.write_bytes(data)
    elif how == "delete":
        file.unlink()
    else:
        file.write_bytes(np.random.default_rng(0).bytes(len(data)))


def decodable_flip(file):
    """Flip a byte that zstd still decodes to a same-sized, different chunk: only the checksum can see it."""
    data = bytearray(file.read_bytes())
    payload, reference = bytes(data[:-4]), Zstd().decode(bytes(data[:-4]))  # the last 4 bytes: crc32c

    def decodes_wrong(i):
        flipped = bytearray(payload)
        flipped[i] ^= 0xFF
        try:
            out = Zstd().decode(bytes(flipped))
        except RuntimeError:
            return False
        return len(out) == len(reference) and out != reference

    candidates = [i for i in range(len(payload)) if decodes_wrong(i)]
    assert candidates, f"no decodable flip in {file}"
    i = min(candidates, key=lambda j: abs(j - len(payload) // 2))
    data[i] ^= 0xFF
    file.write_bytes(data)


def chunk_message(name, coords, covers):
    return re.escape(f"array {name}: ") + ".*" + re.escape(f"chunk {coords} ({covers})")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine") / "pool"
    run_campaign(path, sample_logprobs=True)
    return path


@pytest.fixture
def pool(pristine, tmp_path):
    return Path(shutil.copytree(pristine, tmp_path / "pool"))


@pytest.mark.parametrize("how", ["truncate", "flip", "delete", "garbage"])
@pytest.mark.parametrize("name,coords,covers", CHUNKS)
def test_damaged_chunk_is_named(pool, name, coords, covers, how):
    damage(chunk_file(pool, name, coords), how)
    with pytest.raises(PoolError, match=chunk_message(name, coords, covers)):
        load_pool(pool)
    with pytest.raises(PoolError, match=chunk_message(name, coords, covers)):
        load_pool(pool, partial=True)


@pytest.mark.parametrize("name,coords,covers", CHUNKS)
def test_flip_that_still_decompresses_is_caught_by_the_checksum(pool, name, coords, covers):
    decodable_flip(chunk_file(pool, name, coords))
    with pytest.raises(PoolError, match=chunk_message(name, coords, covers)):
        load_pool(pool)


@pytest.mark.parametrize("how", ["truncate", "flip", "delete", "garbage"])
def test_read_tokens_names_the_damaged_chunk(pool, how):
    damage(chunk_file(pool, "tokens/pi", (2, 0)), how)
    np.testing.assert_array_equal(read_tokens(pool, "mu"), engine_data()[0]["mu"])
    with pytest.raises(PoolError, match=chunk_message("tokens/pi", (2, 0), "rows 8:10")):
        read_tokens(pool, "pi")


def test_partial_load_reads_only_committed_chunks(pool):
    # a killed writer can leave any bytes in an uncommitted region: a partial load never reads them
    (pool / "commits" / f"{draws_key('mu', 'sglang', 0, N, 1, 2)}.json").unlink()
    damage(chunk_file(pool, "logprobs/mu/sglang", (0, 0, 1)), "garbage")
    part = load_pool(pool, partial=True)
    assert part.passes.tolist() == [0, 2, 3]
    np.testing.assert_array_equal(part.logprobs["mu"]["sglang"], engine_data()[1][("mu", "sglang")][:, :, [0, 2, 3]])
    damage(chunk_file(pool, "logprobs/mu/sglang", (1, 0, 2)), "truncate")
    with pytest.raises(PoolError, match=chunk_message("logprobs/mu/sglang", (1, 0, 2), "rows 4:8, passes 2:3")):
        load_pool(pool, partial=True)


def test_write_into_a_damaged_chunk_is_refused(tmp_path):
    writer = create_pool(tmp_path / "p", n=n, num_per_side=N, repeats=R, row_chunk=4)
    tokens = engine_data()[0]["pi"]
    writer.write_tokens("pi", 0, tokens[:2])
    damage(chunk_file(tmp_path / "p", "tokens/pi", (0, 0)), "flip")
    with pytest.raises(PoolError, match=re.escape("array tokens/pi: cannot write into damaged chunk (0, 0) "
                                                  "(rows 0:4)")):
        writer.write_tokens("pi", 2, tokens[2:4])  # rows 2:4 share the chunk of rows 0:2


def test_intact_nan_and_negative_ids_are_named_by_chunk(pool):
    group = zarr.open_group(str(pool), mode="r+")
    group["logprobs/mu/vllm"][5, 2, 1] = np.nan  # an intact chunk (valid checksum) holding bad values
    with pytest.raises(PoolError, match=re.escape("array logprobs/mu/vllm: committed region holds NaN in "
                                                  "chunk (1, 0, 1) (rows 4:8, passes 1:2)")):
        load_pool(pool)
    group["tokens/pi"][9, 0] = -3
    with pytest.raises(PoolError, match=re.escape("array tokens/pi: committed region holds negative values "
                                                  "in chunk (2, 0) (rows 8:10)")):
        read_tokens(pool, "pi")


def test_old_format_pool_is_refused(pool):
    zarr.open_group(str(pool), mode="r+").attrs["format_version"] = 1  # version 1: chunks without checksums
    message = f"pool format version 1, this tvjax reads version {FORMAT_VERSION}; the format differs"
    for attempt in (lambda: load_pool(pool), lambda: read_tokens(pool, "pi"), lambda: open_pool_writer(pool),
                    lambda: create_pool(pool, n=n, num_per_side=N, repeats=R, scorers=SCORERS, top_k=K,
                                        sample_logprobs=True, row_chunk=4, exist_ok=True)):
        with pytest.raises(PoolError, match=message):
            attempt()


def test_array_without_checksums_is_refused(pool):
    zarr.open_group(str(pool), mode="r+").create_array("topk_ids/pi/sglang", shape=(N, n, R, K), dtype="int32",
                                                       chunks=(4, n, 1, K), overwrite=True)
    with pytest.raises(PoolError, match="array topk_ids/pi/sglang: stored without the crc32c checksum codec"):
        load_pool(pool)


def stopping_rows():
    """Rows of n = 5 stopping at EOS ids (2, 7) (pad 2): lengths 2, 5, 3, 5."""
    tokens = np.array([[4, 7, 2, 2, 2], [4, 4, 4, 4, 4], [5, 6, 2, 2, 2], [4, 5, 6, 5, 7]], np.int32)
    return tokens, np.array([2, 5, 3, 5], np.int32)


def stopping_writer(path):
    return create_pool(path, n=5, num_per_side=4, repeats=2, scorers=("a", "b"), top_k=2, sample_logprobs=True,
                       eos_ids=(7, 2))


def test_stopping_pool_round_trip_with_lengths(tmp_path):
    from tvjax.pools.store import pad_stopped, read_lengths

    writer = stopping_writer(tmp_path / "p")
    assert writer.spec.eos_ids == (2, 7) and writer.spec.stops
    tokens, lengths = stopping_rows()
    rng = np.random.default_rng(0)
    raw = np.log(rng.random((4, 5, 2))).astype(np.float32)
    ids, tlp = rng.integers(0, 9, (4, 5, 2, 2)).astype(np.int32), np.log(rng.random((4, 5, 2, 2))).astype(np.float32)
    for side in ("pi", "mu"):
        writer.write_tokens(side, 0, tokens, sample_logprobs=pad_stopped(lengths, 2, raw[..., 0])[0], lengths=lengths)
        for scorer in ("a", "b"):
            writer.write_draws(side, scorer, 0, 0, *pad_stopped(lengths, 2, raw, ids, tlp))
    pool = load_pool(tmp_path / "p")
    assert pool.lengths["mu"].tolist() == [2, 5, 3, 5] and read_lengths(tmp_path / "p", "pi").tolist() == [2, 5, 3, 5]
    assert pool.logprobs["pi"]["a"][0, 2:].tolist() == [[0.0, 0.0]] * 3
    assert pool.logprobs["pi"]["a"][0, :2].tolist() == raw[0, :2].tolist()  # real positions untouched
    assert pool.topk_ids["pi"]["a"][2, 3].tolist() == [[2, 2], [2, 2]]
    assert pool.topk_logprobs["pi"]["a"][2, 3].tolist() == [[0.0, -np.inf], [0.0, -np.inf]]
    assert load_pool(tmp_path / "p", partial=True).lengths["pi"].tolist() == [2, 5, 3, 5]


def test_fixed_length_pools_have_length_n_and_refuse_lengths(tmp_path):
    from tvjax.pools.store import read_lengths

    run_campaign(tmp_path / "p")
    assert load_pool(tmp_path / "p").lengths["pi"].tolist() == [n] * N and read_lengths(tmp_path / "p", "mu").tolist() == [n] * N
    writer = create_pool(tmp_path / "q", n=n, num_per_side=N, repeats=R)
    with pytest.raises(PoolError, match="this pool is fixed-length: create it with eos_ids"):
        writer.write_tokens("pi", 0, np.zeros((N, n), np.int32), lengths=np.full(N, n))


def test_pools_written_before_lengths_load_as_fixed_length(tmp_path):
    run_campaign(tmp_path / "p")
    group = zarr.open_group(str(tmp_path / "p"), mode="r+")
    spec = dict(group.attrs["spec"])
    del spec["eos_ids"]
    group.attrs["spec"] = spec
    pool = load_pool(tmp_path / "p")
    assert pool.spec.eos_ids == () and pool.lengths["pi"].tolist() == [n] * N


def test_stopping_pool_refuses_rows_without_or_against_their_lengths(tmp_path):
    writer = stopping_writer(tmp_path / "p")
    tokens, lengths = stopping_rows()
    zeros = np.zeros((4, 5), np.float32)
    with pytest.raises(PoolError, match=re.escape("outputs stop at EOS ids [2, 7]: give the lengths of the rows")):
        writer.write_tokens("pi", 0, tokens, sample_logprobs=zeros)
    with pytest.raises(PoolError, match=re.escape("rows [0] (of the block): lengths [3] but their first EOS [2, 7] gives [2]")):
        writer.write_tokens("pi", 0, tokens, sample_logprobs=zeros, lengths=np.array([3, 5, 3, 5]))
    bad_pad = tokens.copy()
    bad_pad[2, 4] = 9
    with pytest.raises(PoolError, match=re.escape("rows [2] (of the block): positions after EOS must hold the pad 2")):
        writer.write_tokens("pi", 0, bad_pad, sample_logprobs=zeros, lengths=lengths)
    with pytest.raises(PoolError, match=re.escape("lengths must be in [1, 5]")):
        writer.write_tokens("pi", 0, tokens, sample_logprobs=zeros, lengths=np.array([2, 6, 3, 5]))
    noisy_pad = zeros.copy()
    noisy_pad[0, 3] = -0.1
    with pytest.raises(PoolError, match="sample_logprobs at positions after EOS must be 0"):
        writer.write_tokens("pi", 0, tokens, sample_logprobs=noisy_pad, lengths=lengths)
    assert not writer.done_shards()  # nothing half-written


def test_stopping_pool_refuses_draws_before_tokens_and_draws_past_the_end(tmp_path):
    from tvjax.pools.store import pad_readout

    writer = stopping_writer(tmp_path / "p")
    tokens, lengths = stopping_rows()
    draws = np.zeros((4, 5, 1), np.float32)
    ids, tlp = np.full((4, 5, 1, 2), 2, np.int32), np.broadcast_to(pad_readout(2, 2)[1], (4, 5, 1, 2)).copy()
    with pytest.raises(PoolError, match="before their tokens"):
        writer.write_draws("pi", "a", 0, 0, draws, ids, tlp)
    writer.write_tokens("pi", 0, tokens, sample_logprobs=np.zeros((4, 5), np.float32), lengths=lengths)
    late = draws.copy()
    late[0, 3, 0] = -1.0  # a draw after row 0's EOS (length 2)
    with pytest.raises(PoolError, match="logprobs at positions after EOS must be 0"):
        writer.write_draws("pi", "a", 0, 0, late, ids, tlp)
    wrong_readout = ids.copy()
    wrong_readout[0, 4, 0, 0] = 5
    with pytest.raises(PoolError, match="top-k readout at a padded position"):
        writer.write_draws("pi", "a", 0, 0, draws, wrong_readout, tlp)
    writer.write_draws("pi", "a", 0, 0, draws, ids, tlp)  # the pad itself is accepted
