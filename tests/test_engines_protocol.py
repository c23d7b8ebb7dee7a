"""The job protocol between the campaign and the engine workers (numpy + tvjax.pools.store, no engine)."""

import json

import numpy as np
import pytest

from tvjax.engines import protocol
from tvjax.pools import store as pools


def test_seeds_are_deterministic_and_independent_per_pass_and_side():
    seeds = {protocol.pass_seed(0, side, j) for side in pools.SIDES for j in range(16)}
    assert len(seeds) == 32 and protocol.pass_seed(0, "pi", 3) == protocol.pass_seed(0, "pi", 3)
    assert protocol.pass_seed(0, "pi", 0) != protocol.pass_seed(1, "pi", 0)
    assert all(0 <= s < 2**31 for s in seeds)


def test_load_job_names_what_is_missing(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"engine": {"kind": "vllm", "name": "v"}, "pool": "p", "messages": [], "tasks": []}))
    with pytest.raises(ValueError, match="'seed'"):
        protocol.load_job(path)
    path.write_text(json.dumps({"engine": {"kind": "vllm", "name": "v", "seed": 0}, "pool": "p", "messages": [],
                                "tasks": [], "scoring": "echo"}))
    with pytest.raises(ValueError, match="scoring"):
        protocol.load_job(path)


def test_read_tokens_refuses_an_unsampled_side(tmp_path):
    writer = pools.create_pool(tmp_path / "pool", n=3, num_per_side=2, repeats=1, scorers=("a", "b"), top_k=2)
    with pytest.raises(pools.PoolError, match="sample them first"):
        pools.read_tokens(writer.path, "pi")
    writer.write_tokens("pi", 0, np.arange(6).reshape(2, 3))
    assert pools.read_tokens(writer.path, "pi").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_an_engine_with_another_chat_template_is_refused(tmp_path):
    writer = pools.create_pool(tmp_path / "pool", n=3, num_per_side=2, repeats=1, scorers=("a", "b"), top_k=2)
    protocol.check_prompt(writer, [1, 2, 3])
    protocol.check_prompt(pools.open_pool_writer(writer.path), [1, 2, 3])
    with pytest.raises(protocol.EngineError, match="differs"):
        protocol.check_prompt(pools.open_pool_writer(writer.path), [1, 2, 4])


def test_scored_blocks_are_checked():
    tokens = np.zeros((2, 3), np.int32)
    good = protocol.Scored(np.full((2, 3), -0.5, np.float32), np.zeros((2, 3, 4), np.int32),
                           np.full((2, 3, 4), -1.0, np.float32))
    protocol.check_scored(good, tokens, 4)
    with pytest.raises(protocol.EngineError, match="NaN"):
        protocol.check_scored(good._replace(logprobs=np.full((2, 3), np.nan, np.float32)), tokens, 4)
    with pytest.raises(protocol.EngineError, match="above 0"):
        protocol.check_scored(good._replace(logprobs=np.full((2, 3), 0.5, np.float32)), tokens, 4)
    with pytest.raises(protocol.EngineError, match="shapes"):
        protocol.check_scored(good, tokens, 5)


def test_task_shard_keys_are_the_shards_the_writer_commits(tmp_path):
    writer = pools.create_pool(tmp_path / "pool", n=3, num_per_side=2, repeats=2, scorers=("a", "b"), top_k=2)
    committed = [writer.write_tokens("mu", 0, np.arange(6).reshape(2, 3))]
    for j in range(2):
        committed.append(writer.write_draws("mu", "b", 0, j, np.full((2, 3, 1), -0.5, np.float32),
                                            topk_ids=np.zeros((2, 3, 1, 2), np.int32),
                                            topk_logprobs=np.full((2, 3, 1, 2), -0.5, np.float32)))
    keys = [key for op in ("sample", "score") for key in protocol.task_shard_keys({"op": op, "side": "mu"}, "b", writer.spec)]
    assert keys == committed
    with pytest.raises(ValueError, match="unknown task op"):
        protocol.task_shard_keys({"op": "echo", "side": "mu"}, "b", writer.spec)


STOP = protocol.Eos("stop", (2, 5))


def test_collect_sampled_pads_rows_after_their_first_eos():
    rows = [[7, 5, 9], [2], [7, 8, 9, 9], [1, 2, 2, 2]]  # EOS 5 then junk; EOS at once; no EOS; generate's padding
    lps = [[-1.0, -2.0, -3.0], [-0.5], [-1.0] * 4, [-1.0, -0.25, -9.0, -9.0]]
    sampled = protocol.collect_sampled(rows, lps, 4, STOP)
    assert sampled.lengths.tolist() == [2, 1, 4, 2]
    assert sampled.tokens.tolist() == [[7, 5, 2, 2], [2, 2, 2, 2], [7, 8, 9, 9], [1, 2, 2, 2]]
    assert sampled.logprobs.tolist() == [[-1, -2, 0, 0], [-0.5, 0, 0, 0], [-1] * 4, [-1, -0.25, 0, 0]]
    with pytest.raises(protocol.EngineError, match="ending at an EOS id"):
        protocol.collect_sampled([[7, 8]], [[-1.0, -1.0]], 4, STOP)  # ended early without EOS
    suppress = protocol.Eos("suppress", (2,))
    assert protocol.collect_sampled([[7, 8]], [[-1.0, -1.0]], 2, suppress).lengths is None
    with pytest.raises(protocol.EngineError, match="EOS not suppressed"):
        protocol.collect_sampled([[7]], [[-1.0]], 2, suppress)
    with pytest.raises(protocol.EngineError, match="under eos=suppress"):
        protocol.collect_sampled([[7, 2]], [[-1.0, -1.0]], 2, suppress)
    with pytest.raises(ValueError, match="eos must be one of"):
        protocol.eos_policy({"eos": "truncate"}, [2])


class FakeBridge:
    """A bridge without an engine: fixed samples; replay returns NaN after each row's end (what
    the worker must replace by the pad) and -0.5 up to it."""

    tokenizer = None

    def __init__(self, eos, rows):
        self.eos, self.rows = eos, rows

    def sample(self, prompt_ids, num, n, seed):
        return protocol.collect_sampled(self.rows, [[-0.5] * len(r) for r in self.rows], n, self.eos)

    def replay(self, prompt_ids, tokens, seed):
        protocol.check_replayed(list(tokens), tokens, self.eos)
        N, n = tokens.shape
        real = ~pools.padded_positions(self.eos.lengths(tokens), n)
        lp = np.where(real, -0.5, np.nan).astype(np.float32)
        return protocol.Scored(lp, np.zeros((N, n, 2), np.int32), np.where(real[..., None], -0.5, np.nan).astype(np.float32))


def stop_job(pool, eos="stop", name="a"):
    return {"engine": {"name": name, "kind": "fake", "seed": 0, "eos": eos}, "pool": str(pool), "messages": [],
            "scoring": "replay", "tasks": [{"op": "sample", "side": "pi"}, {"op": "score", "side": "pi"}]}


def test_a_stopping_pool_gets_lengths_and_the_pad(tmp_path):
    pools.create_pool(tmp_path / "pool", n=4, num_per_side=3, repeats=1, scorers=("a", "b"), top_k=2,
                      sample_logprobs=True, eos_ids=(2, 5))
    protocol.run_tasks(stop_job(tmp_path / "pool"), FakeBridge(STOP, [[7, 5], [3, 3, 3, 3], [2]]), [1])
    group = __import__("zarr").open_group(str(tmp_path / "pool"), mode="r")
    assert np.asarray(group["lengths/pi"][:]).tolist() == [2, 4, 1]
    assert np.asarray(group["tokens/pi"][:]).tolist() == [[7, 5, 2, 2], [3, 3, 3, 3], [2, 2, 2, 2]]
    lp = np.asarray(group["logprobs/pi/a"][:, :, 0])
    assert lp.tolist() == [[-0.5, -0.5, 0, 0], [-0.5] * 4, [-0.5, 0, 0, 0]]
    ids, top = np.asarray(group["topk_ids/pi/a"][:, :, 0]), np.asarray(group["topk_logprobs/pi/a"][:, :, 0])
    assert (ids[0, 2:] == 2).all() and top[0, 2:].tolist() == [[0, -np.inf]] * 2


@pytest.mark.parametrize("pool_eos, engine, message", [
    ((), protocol.Eos("stop", (2,)), "the pool stores no lengths: create it with eos_ids"),
    ((2,), protocol.Eos("suppress", (2,)), "eos=suppress but the pool's outputs stop at EOS ids"),
    ((2,), protocol.Eos("stop", (2, 5)), "different EOS tokens"),
])
def test_an_engine_that_treats_eos_otherwise_is_refused_before_writing(tmp_path, pool_eos, engine, message):
    pools.create_pool(tmp_path / "pool", n=4, num_per_side=3, repeats=1, scorers=("a", "b"), top_k=2,
                      sample_logprobs=True, eos_ids=pool_eos)
    with pytest.raises(protocol.EngineError, match=message):
        protocol.run_tasks(stop_job(tmp_path / "pool", engine.mode), FakeBridge(engine, [[7, 2]] * 3), [1])
    assert not any(mask.any() for mask in pools.coverage(tmp_path / "pool").values())
    assert "prompt_token_ids" not in pools.read_spec(tmp_path / "pool")[1]


def test_replayed_rows_must_match_up_to_each_length():
    tokens = np.array([[7, 5, 2, 2], [3, 3, 3, 3]])
    protocol.check_replayed([[7, 5], [3, 3, 3, 3]], tokens, STOP)  # a request that finished at its EOS
    protocol.check_replayed([[7, 5, 2], [3, 3, 3, 3]], tokens, STOP)  # generate's padding after it
    with pytest.raises(protocol.EngineError, match="forcing failed"):
        protocol.check_replayed([[7], [3, 3, 3, 3]], tokens, STOP)
    with pytest.raises(protocol.EngineError, match="forcing failed"):
        protocol.check_replayed([[7, 5], [3, 3, 3, 3]], tokens, protocol.Eos("suppress", (2, 5)))
