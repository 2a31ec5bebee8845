"""Where a tiny-LM warm start sits before any RL: the probe behind the choice of an LM regime.

For one warm start (a ``policy.model`` section, trained and cached as a run would) and its task's
held-out questions: greedy accuracy, and how often greedy decoding answers at once (``\\boxed{..}``
first) instead of working the steps; then K samples per question at temperature 1, their pass@1,
pass@K and each strategy's share and accuracy. A warm start at the edge of its competence has
greedy accuracy well below pass@K; one whose sampled strategies differ in accuracy gives RL a
choice to learn.

It reads the held-out split that the config's ``task.held_out`` names, the tuning split by default:
the one a regime is chosen on. Sampling is seeded (``--seed``), so a reading repeats exactly.

    .venv/bin/python bench/warm_start_probe.py experiments/tiny-lm-chain.yaml
    .venv/bin/python bench/warm_start_probe.py experiments/tiny-lm-chain.yaml \\
        --set policy.model.sft_steps=200 --set policy.model.sft_direct_fraction=0
"""

from __future__ import annotations

import argparse
import json

import torch

from exgrpo.policies.lm.engine import RolloutEngine, SamplingParams
from exgrpo.policies.lm.tiny_lm import load_tiny_lm
from exgrpo.config import load_experiment, parse_set
from exgrpo.tasks.text_arithmetic import TextArithmetic


def probe(config: str, overrides: dict, k: int, sampled_questions: int, seed: int = 0) -> dict:
    cfg = load_experiment(config, overrides)
    tiny = load_tiny_lm(cfg.policy.model, progress=True)
    task = TextArithmetic(cfg.task, tokenizer=tiny.tokenizer)
    engine = RolloutEngine(tiny.model, tiny.tokenizer.pad_id, tiny.tokenizer.eos_id,
                           SamplingParams(max_new_tokens=cfg.policy.max_new_tokens, temperature=1.0))
    ids = task.val_ids
    with torch.no_grad():
        greedy = engine.generate(task.prompts(ids), greedy=True)
        g_reward = task.rewards(ids, greedy.tokens, greedy.mask)  # (Q,)
        g_direct = torch.tensor([t.startswith("\\boxed") for t in task.decode(greedy.tokens, greedy.mask)])
        rows = [q for q in ids[:sampled_questions] for _ in range(k)]
        sampled = engine.generate(task.prompts(rows), torch.Generator().manual_seed(seed), greedy=False)
        s_reward = task.rewards(rows, sampled.tokens, sampled.mask).view(-1, k)  # (Q, K)
        s_direct = torch.tensor([t.startswith("\\boxed") for t in task.decode(sampled.tokens, sampled.mask)]).view(-1, k)

    def acc(reward: torch.Tensor, where: torch.Tensor) -> float | None:
        return round(float(reward[where].mean()), 3) if where.any() else None

    return {
        "warm_start": str(tiny.path), "cached": tiny.cache_hit, "held_out": str(cfg.task.held_out),
        "held_out_questions": len(ids), "seed": seed,
        "greedy_accuracy": round(float(g_reward.mean()), 3), "greedy_direct_share": round(float(g_direct.float().mean()), 3),
        "sampled_pass@1": round(float(s_reward.mean()), 3), f"sampled_pass@{k}": round(float(s_reward.max(1).values.mean()), 3),
        "sampled_direct_share": round(float(s_direct.float().mean()), 3),
        "sampled_accuracy_direct": acc(s_reward, s_direct), "sampled_accuracy_worked": acc(s_reward, ~s_direct),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="an experiment or comparison YAML of the tiny-lm tier")
    ap.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field (repeatable)")
    ap.add_argument("--k", type=int, default=8, help="samples per question (default 8)")
    ap.add_argument("--questions", type=int, default=200, help="held-out questions sampled K times (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampled answers (default 0)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(json.dumps(probe(args.config, parse_set(args.set), args.k, args.questions, args.seed), indent=1))


if __name__ == "__main__":
    main()
