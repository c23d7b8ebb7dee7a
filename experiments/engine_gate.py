"""Hydra app: gate a release on two engine configurations, sampled in rounds (the gate of issue 15).

    .venv/bin/python experiments/engine_gate.py experiment=engine_fp32_vs_bf16 gate.tau=0.1
    .venv/bin/python experiments/engine_gate.py experiment=engine_topk20_vs_topk30 gate.tau=0.05 campaign.eos=stop

Round k is one engine campaign (`engine_campaign.run_campaign`: both engines sample
gate.round_size continuations per side and replay-score both sides) into its own pool,
ROUND_DIR/round-k/pool, with the engines' seeds derived from (seed, k), so rounds are
independent. After each round the gate's confidence sequence (`tvjax.audit.sequential`) takes the
round's rows; it stops at the first round that decides, or after gate.max_rounds / gate.budget
queries. Replay that repeats itself across passes is exact scoring; replay that does not (GPU
serving) is the plug-in over the R passes with its bias bound, and each engine's A/A control
(its own passes in two halves) is reported next to the verdict. Prints one verdict line, writes
gate.json beside the rounds, and exits 0 / 1 / 2 (PASS / FAIL / INCONCLUSIVE). Rerunning with the
same hydra.run.dir resumes: finished rounds' pools are reused, a killed round resumes its shards.
An error (a worker that fails, a refused configuration) exits 3 with the reason, never a verdict.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import hydra
from engine_campaign import CampaignError, run_campaign
from omegaconf import DictConfig, OmegaConf

from tvjax.audit.sequential import decide, noise_floor, pool_rounds, pool_scoring, sequence_estimates
from tvjax.cli import verdict_line
from tvjax.core import cost
from tvjax.core.jsonable import to_jsonable
from tvjax.engines.protocol import derive_seed
from tvjax.pools.store import PoolError, load_pool


def round_config(cfg: DictConfig, index: int, folder: Path) -> DictConfig:
    """Round `index`'s campaign: its own pool, gate.round_size per side, seeds derived per round."""
    round_cfg = copy.deepcopy(cfg)
    OmegaConf.set_struct(round_cfg, False)
    round_cfg.campaign.pool = str(folder / f"round-{index}" / "pool")
    round_cfg.campaign.num_per_side = int(cfg.gate.round_size)
    round_cfg.campaign.report = False
    for side in ("pi", "mu"):
        round_cfg[side].seed = derive_seed(int(cfg[side].seed), index)
    return round_cfg


def campaign_rounds(cfg: DictConfig, folder: Path, pools: list, scorings: list):
    """Rounds of observations, one campaign each; the loaded pools and their scorings are kept
    (the A/A control reads them all). Refuses replay whose determinism changes between rounds:
    the bias bound was set by the first round."""
    for index in range(int(cfg.gate.max_rounds)):
        pool = load_pool(run_campaign(round_config(cfg, index, folder)), load_topk=False)
        scoring = pool_scoring(pool)
        if scorings and scoring.deterministic != scorings[0].deterministic:
            raise CampaignError(f"round {index}'s replay is {'' if scoring.deterministic else 'not '}deterministic, "
                                "unlike round 0's: rerun with repeats >= 2 so both are measured alike")
        pools.append(pool)
        scorings.append(scoring)
        yield from pool_rounds(pool, scorings[0], int(cfg.gate.round_size))


def run_gate(cfg: DictConfig, folder: Path):
    """The GateResult of gating the campaign's two engines in rounds, and the pools it read."""
    g = cfg.gate
    per_round = float(cost.symmetric_queries(int(g.round_size), int(cfg.campaign.n), int(cfg.campaign.repeats)))
    budget = float("inf") if g.budget is None else float(g.budget)
    if per_round > budget:
        raise CampaignError(f"gate.budget={budget:.4g} queries is less than one round ({per_round:.4g})")
    pools, scorings = [], []
    rounds = campaign_rounds(cfg, folder, pools, scorings)

    def estimates():
        first = next(rounds)  # the first round fixes r and r_c
        chained = (obs for part in ([first], rounds) for obs in part)
        for estimate in sequence_estimates(chained, float(g.delta), scorings[0].repeats, scorings[0].coarse):
            print(f"round {estimate.rounds}: [{estimate.low:.4f}, {estimate.high:.4f}] after "
                  f"{estimate.observations} observations, {estimate.queries:.3g} queries", file=sys.stderr, flush=True)
            yield estimate
            if estimate.queries + per_round > budget:
                return

    result = decide(estimates(), float(g.tau), float(g.delta), None if g.budget is None else budget)
    if not scorings[0].deterministic:
        floors = {s: noise_floor(pools, s, float(g.delta), int(g.round_size)) for s in scorings[0].pair}
        result = result._replace(noise_floor=floors)
    return result, pools


@hydra.main(version_base="1.3", config_path="../configs", config_name="engine_gate")
def main(cfg: DictConfig) -> None:
    folder = Path(cfg.gate.folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        result, pools = run_gate(cfg, folder)
    except (CampaignError, PoolError, ValueError) as error:  # never a verdict's exit code
        print(f"engine_gate: error: {error}", file=sys.stderr, flush=True)
        sys.exit(3)
    print(verdict_line(result), flush=True)
    for scorer, floor in (result.noise_floor or {}).items():
        print(f"A/A noise floor of {scorer}: [{floor.low:.4f}, {floor.high:.4f}] (estimate {floor.value:.4f})", flush=True)
    record = {"pi": OmegaConf.to_container(cfg.pi, resolve=True), "mu": OmegaConf.to_container(cfg.mu, resolve=True),
              "campaign": OmegaConf.to_container(cfg.campaign, resolve=True), "gate": OmegaConf.to_container(cfg.gate),
              "rounds": [str(p.metadata.get("campaign", {}).get("pool", "")) for p in pools], **result._asdict()}
    (folder / "gate.json").write_text(json.dumps(to_jsonable(record), indent=1, allow_nan=False))
    sys.exit(result.exit_code)


if __name__ == "__main__":
    main()
