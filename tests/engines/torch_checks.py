"""Replay arithmetic on synthetic logits, run inside the transformers venv (torch) by
tests/test_engines_replay.py:  .venv-transformers/bin/python -m pytest tests/engines/torch_checks.py
"""

import math

import pytest
import torch

from tvjax.engines import readouts, replay
from tvjax.engines.sglang_bridge import process_batch

INF = float("inf")


def test_topk_mask_keeps_ties_at_the_boundary():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0, -INF]])
    assert replay.topk_mask(logits, 2).tolist() == [[True, True, True, True, False, False]]
    assert replay.topk_mask(logits, 1).tolist() == [[True, False, False, False, False, False]]
    assert replay.topk_mask(logits, None).tolist() == [[True] * 5 + [False]]


def test_topk_logprobs_renormalize_over_the_set():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    lp = replay.topk_logprobs(logits, 7)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(5), atol=1e-6)
    assert (torch.isfinite(lp).sum(-1) == 7).all()
    top = torch.topk(logits, 7).values
    expected = top - torch.logsumexp(top, -1, keepdim=True)
    assert torch.allclose(torch.topk(lp, 7).values, expected, atol=1e-6)


def test_topk_logprobs_in_float32_for_bf16_logits():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1)).bfloat16()
    lp = replay.topk_logprobs(logits, 20)
    assert lp.dtype == torch.float32
    assert (torch.isfinite(lp).sum(-1) >= 20).all()  # bf16 rounding makes ties: the set may be larger


def test_realized_is_minus_inf_outside_the_top_k():
    logits = torch.tensor([[4.0, 3.0, 1.0, 0.0]])
    lp = replay.topk_logprobs(logits, 2)
    assert replay.realized(lp, torch.tensor([2])).item() == -INF
    assert replay.realized(lp, torch.tensor([0])).item() == pytest.approx(-math.log1p(math.exp(-1.0)), abs=1e-6)


def test_suppress_removes_banned_before_truncation():
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0]])
    lp = replay.topk_logprobs(replay.suppress(logits, [0]), 2)
    assert torch.isfinite(lp).tolist() == [[False, True, True, False]]
    assert logits[0, 0] == 5.0  # not modified in place


def test_nan_and_empty_rows_are_refused():
    with pytest.raises(ValueError, match="NaN"):
        replay.topk_logprobs(torch.tensor([[0.0, float("nan")]]), 1)
    with pytest.raises(ValueError, match="no finite entry"):
        replay.topk_logprobs(torch.tensor([[-INF, -INF]]), 1)
    with pytest.raises(ValueError, match="top_k"):
        replay.topk_logprobs(torch.tensor([[0.0, 1.0]]), 0)


def test_replay_step_records_before_forcing():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(2))
    targets = torch.tensor([0, 5, 7, 29])
    record, forced = replay.replay_step(logits, targets, 10, [3], width=12)
    lp = replay.topk_logprobs(replay.suppress(logits, [3]), 10)
    assert torch.equal(record.realized, replay.realized(lp, targets))
    assert record.topk_ids.shape == (4, 12) and record.topk_logprobs.shape == (4, 12)
    assert torch.isinf(record.topk_logprobs[:, 10:]).all()
    assert torch.equal(forced.argmax(-1), targets)
    assert (torch.isfinite(forced).sum(-1) == 1).all()


def test_force_makes_sampling_deterministic():
    logits = torch.randn(8, 16, generator=torch.Generator().manual_seed(3))
    targets = torch.randint(0, 16, (8,), generator=torch.Generator().manual_seed(4))
    probs = torch.softmax(replay.force(logits, targets), -1)
    drawn = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(5)).squeeze(-1)
    assert torch.equal(drawn, targets)


def test_renormalize_readout_matches_the_full_computation():
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(6)) * 3
    full = torch.log_softmax(logits, -1)
    k, tokens = 20, torch.arange(6) * 15
    top = torch.topk(full, 25).values
    via_readout = torch.from_numpy(readouts.renormalize_readout(replay.realized(full, tokens), top, k))
    direct = replay.realized(replay.topk_logprobs(logits, k), tokens)
    assert torch.allclose(via_readout, direct, atol=1e-5) or torch.equal(via_readout, direct)
    assert torch.equal(torch.isinf(via_readout), torch.isinf(direct))


def test_score_trajectory_drops_banned_and_renormalizes():
    logits = torch.randn(5, 60, generator=torch.Generator().manual_seed(7)) * 2
    full = torch.log_softmax(logits, -1)
    banned, k, width = [int(full[0].argmax())], 8, 10
    tokens = torch.randint(0, 60, (5,), generator=torch.Generator().manual_seed(8))
    tops = []
    for t in range(5):
        values, ids = torch.topk(full[t], k + 1)
        tops.append(dict(zip(ids.tolist(), values.tolist())) | {int(tokens[t]): float(full[t, tokens[t]])})
    realized, _ids, topk_logprobs = map(torch.from_numpy, readouts.score_trajectory(tops, tokens.tolist(), k, banned, width))
    direct = replay.topk_logprobs(replay.suppress(logits, banned), k)
    expected = replay.realized(direct, tokens)
    assert torch.equal(torch.isinf(realized), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert torch.allclose(realized[finite], expected[finite], atol=1e-5)
    assert torch.allclose(topk_logprobs[:, :k], torch.topk(direct, k).values, atol=1e-5)
    with pytest.raises(ValueError, match="finite top_k"):
        readouts.score_trajectory(tops, tokens.tolist(), None, banned, width)


def test_lookup_finds_sampled_tokens_in_the_readout():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(9))
    lp = replay.topk_logprobs(logits, 5)
    ids, values = replay.readout(lp, 5)
    tokens = ids[:, 2]
    assert torch.equal(replay.lookup(ids, values, tokens), replay.realized(lp, tokens))
    outside = torch.topk(logits, 6).indices[:, -1]
    assert torch.isinf(replay.lookup(ids, values, outside)).all()


def test_sglang_process_batch_on_synthetic_logits():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(10))
    original = logits.clone()
    common = {"k": 6, "banned": [1], "width": 8}
    params = [{"mode": "replay", "targets": [4, 9, 11], **common}, None, {"mode": "sample", **common}]
    out, records = process_batch(logits, params, steps=[1, 0, 2])
    assert set(records) == {0, 2}
    expected = replay.topk_logprobs(replay.suppress(original, [1]), 6)
    assert records[0].realized.item() == pytest.approx(expected[0, 9].item(), abs=1e-6)
    assert out[0].argmax().item() == 9 and torch.isfinite(out[0]).sum() == 1
    assert torch.equal(out[1], original[1])
    assert out[2, 1] == -INF and torch.equal(torch.isfinite(out[2]).sum(), torch.tensor(39))
    assert records[2].realized.item() == -INF
    sampled = torch.tensor(int(records[2].topk_ids[3]))
    assert replay.lookup(records[2].topk_ids, records[2].topk_logprobs, sampled).item() == \
        pytest.approx(expected[2, sampled].item(), abs=1e-6)


def test_vllm_replay_rows_record_into_their_sessions_sink():
    from types import SimpleNamespace

    from tvjax.engines.vllm_bridge import ReplayRows

    class SessionRows(ReplayRows):
        records = {}

    rows = SessionRows(None, torch.device("cpu"), False)
    common = {"k": 6, "banned": [1], "width": 8}
    replayed = SimpleNamespace(extra_args={"tvjax": {"mode": "replay", "key": "r", "targets": [4, 9], **common}})
    sampled = SimpleNamespace(extra_args={"tvjax": {"mode": "sample", **common}})
    untouched = SimpleNamespace(extra_args=None)
    output = []
    rows.update_state(SimpleNamespace(removed=[], moved=[],
                                      added=[(0, replayed, None, output), (1, untouched, None, []), (2, sampled, None, [])]))
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(11))
    original = logits.clone()
    out = rows.apply(logits)
    expected = replay.topk_logprobs(replay.suppress(original, [1]), 6)
    assert list(SessionRows.records) == ["r"] and not hasattr(ReplayRows, "records")
    assert SessionRows.records["r"][0].realized.item() == pytest.approx(expected[0, 4].item(), abs=1e-6)
    assert out[0].argmax().item() == 4 and torch.isfinite(out[0]).sum() == 1
    assert torch.equal(out[1], original[1]) and out[2, 1] == -INF
    output.append(4)
    rows.apply(torch.randn(3, 40, generator=torch.Generator().manual_seed(12)))
    assert len(SessionRows.records["r"]) == 2


def test_pad_steps_extends_a_stopped_record_with_placeholders():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(13))
    record, _ = replay.replay_step(logits, torch.tensor([1, 2, 3]), 4, [], width=5)
    steps = replay.stack([record, record], 1)  # [3, 2] steps on axis 1 (transformers' generate ended early)
    padded = replay.pad_steps(steps, 4, axis=1)
    assert padded.realized.shape == (3, 4) and padded.topk_ids.shape == (3, 4, 5)
    assert torch.equal(padded.realized[:, :2], steps.realized) and (padded.realized[:, 2:] == 0).all()
    assert torch.isinf(padded.topk_logprobs[:, 2:]).all()
    one = replay.StepRecord(*(t[0] for t in steps))  # one request's [2] steps on axis 0
    assert replay.pad_steps(one, 2).realized.shape == (2,) and replay.pad_steps(one, 1).topk_ids.shape == (1, 5)
