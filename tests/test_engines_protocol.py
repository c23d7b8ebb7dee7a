"""The job protocol between the campaign and the engine workers (numpy + tvjax.pools, no engine)."""

import json

import numpy as np
import pytest

from tvjax import pools
from tvjax.engines import protocol


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
