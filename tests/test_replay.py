"""The replay core (exgrpo.core.replay / batch): one strategy per algorithm, pure batch building."""

import numpy as np
import pytest
import torch

from exgrpo.config import ExGRPOConfig, ReplayKind, UniformReplayConfig
from exgrpo.core.batch import Replays, StepBatch, assemble_batch, batch_metrics, generation_qids, rewarded_groups
from exgrpo.core.fresh import FreshSampler
from exgrpo.core.pool import Trajectory
from exgrpo.core.replay import REPLAY_STRATEGIES, BucketReplay, ReplayStrategy, make_replay_strategy


def traj(tokens, step=0, entropy=0.5):
    return Trajectory(tuple(tokens), tuple(-0.1 * (i + 1) for i in range(len(tokens))), entropy, step)


def test_every_replay_kind_has_a_strategy():
    assert set(REPLAY_STRATEGIES) == set(ReplayKind)
    labels = [cls.label for cls in REPLAY_STRATEGIES.values()]
    assert len(set(labels)) == len(labels)


def test_assemble_batch_layout_is_group_major_with_stored_row_first():
    k = 3
    replays = Replays([7], [traj([5, 6, 7, 8])], torch.tensor([[-1.0, -2.0, -3.0, -4.0]]), [1])
    gen_q = generation_qids([7], [9], k)
    assert gen_q == [7, 7, 9, 9, 9]
    m = len(gen_q)
    tokens = torch.arange(m * 2).view(m, 2) + 10
    mask = torch.ones(m, 2, dtype=torch.bool)
    log_prob = torch.full((m, 2), -0.5)
    batch = assemble_batch(replays, [9], tokens, mask, log_prob, torch.zeros(m, 2), k)
    assert batch.row_qids == [7, 7, 7, 9, 9, 9] and batch.group_qids == [7, 9]
    assert batch.off_policy.tolist() == [True, False, False, False, False, False]
    assert batch.tokens.shape == (6, 4)
    assert batch.tokens[0].tolist() == [5, 6, 7, 8] and batch.old_log_prob[0].tolist() == [-1, -2, -3, -4]
    assert batch.tokens[1, :2].tolist() == [10, 11] and not batch.mask[1, 2:].any()
    assert torch.allclose(batch.behaviour_entropy[0], torch.full((4,), 0.5))

    rewards = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    groups = rewarded_groups(batch, rewards, step=4)
    assert [(g.qid, g.num_correct, len(g.correct)) for g in groups] == [(7, 2, 2), (9, 0, 0)]
    assert groups[0].correct[0].tokens == (5, 6, 7, 8) and groups[0].correct[0].step == 4

    # fresh_solved counts the fresh questions' groups only: the replayed group's new
    # rollouts (1 of 2 solved) have their own metric and do not inflate it
    m = batch_metrics(rewards, batch)
    assert m["batch/fresh_solved"] == 0.0 and m["batch/replayed_fresh_solved"] == 0.5
    assert m["batch/solved"] == pytest.approx(2 / 6) and m["replay/questions"] == 1


def test_bucket_strategy_life_plan_select_observe_resume():
    algo = ExGRPOConfig(group_size=4, experience_ratio=0.5, replay_start_pass_rate=0.3)
    s = make_replay_strategy(algo, np.random.default_rng(0))
    assert isinstance(s, BucketReplay)
    assert s.plan(8) == 0 and not s.mixed_phase  # replay off until the switch
    s.after_step(0.5, step=0)
    assert s.mixed_phase and s.plan(8) == 4

    # one replayed-free batch: q1 solved 2/4 (collected), q2 solved 4/4 (retired)
    rows = [[1, 2], [1, 3], [9, 9], [9, 8], [4], [4], [4], [4]]
    tokens = torch.tensor([r + [0] * (2 - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (2 - len(r)) for r in rows])
    batch = assemble_batch(Replays.empty(), [1, 2], tokens, mask, torch.zeros(8, 2), torch.ones(8, 2), 4)
    s.observe(batch, torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), step=1)
    assert s.retired == {2} and s.pool.bucket_of(1) == 2 and len(s.pool.trajectories(1)) == 2

    scored = []

    def score(qids, tok, m):
        scored.append(list(qids))
        ent = torch.tensor([[0.9, 0.9], [0.1, 0.1]])[: tok.shape[0]]
        return torch.zeros_like(tok, dtype=torch.float), ent

    replays = s.select(4, score)
    assert replays.qids == [1] and scored == [[1, 1]]
    assert replays.trajectories[0].tokens == (1, 3)  # the lowest-entropy one
    assert s.stats()["pool/retired"] == 1 and s.stats()["replay/active"] == 1

    s2 = make_replay_strategy(algo, np.random.default_rng(0))
    s2.load_state_dict(s.state_dict())
    assert s2.mixed_phase and s2.retired == {2} and s2.pool.to_frame().equals(s.pool.to_frame())


class ReplayFirstQuestion(ReplayStrategy):
    """A trivial fourth strategy: always 'replays' nothing but counts its calls."""

    label = "trivial"
    calls = 0

    def plan(self, batch_size):
        type(self).calls += 1
        return super().plan(batch_size)


def test_a_new_strategy_is_one_class_and_a_registry_entry(tmp_path, monkeypatch):
    """No backend change: the native trainer runs whatever the registry holds for the config's kind."""
    from exgrpo.backends.native.trainer import Trainer
    from exgrpo.config import load_experiment

    monkeypatch.setitem(REPLAY_STRATEGIES, ReplayKind.UNIFORM, ReplayFirstQuestion)
    cfg = load_experiment("experiments/toy-exgrpo.yaml", {
        "task.max_operand": 4, "policy.hidden": 16, "policy.layers": 1, "algorithm.group_size": 2,
        "train.batch_size": 8, "train.max_steps": 3, "algorithm.replay": "uniform", "output_dir": str(tmp_path)})
    trainer = Trainer(cfg)
    assert isinstance(trainer.replay, ReplayFirstQuestion)
    trainer.fit(progress=False)
    assert ReplayFirstQuestion.calls == 3


@pytest.mark.parametrize("seed", [0, 1])
def test_uniform_strategy_ignores_buckets(seed):
    algo = UniformReplayConfig(group_size=4, replay_start_pass_rate=0.0)
    s = make_replay_strategy(algo, np.random.default_rng(seed))
    for q in range(20):
        s.pool.observe_group(q, 1 if q < 19 else 2, [traj([q + 1])], step=0)
    counts = np.zeros(20)
    for _ in range(400):
        for q in s.sample_questions(1):
            counts[q] += 1
    # buckets would give q19 (alone in bucket 2) about half the mass; uniform gives it ~1/20
    assert counts[19] < 60 and counts[:19].sum() > 340


def test_rewarded_groups_keeps_each_groups_distinct_correct_responses_in_batch_order():
    """Against a plain per-row reading of the batch: duplicates dropped within a group only, each kept
    response cut to its length, with its behaviour log-probs and mean entropy over its tokens."""
    g_, k, t = 6, 4, 5
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 3, (g_ * k, t), generator=gen)  # few token values: many duplicate responses
    lengths = torch.randint(1, t + 1, (g_ * k,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    tokens[3], mask[3] = tokens[8], mask[8]  # the same response in two groups: kept in both
    tokens[2], mask[2] = tokens[1], mask[1]  # a duplicate inside group 0
    batch = StepBatch(list(range(10, 10 + g_)), [q for q in range(10, 10 + g_) for _ in range(k)], tokens, mask,
                      torch.randn(g_ * k, t, generator=gen), torch.rand(g_ * k, t, generator=gen),
                      torch.zeros(g_ * k, dtype=torch.bool), 0)
    rewards = (torch.rand(g_, k, generator=gen) < 0.6).float()
    rewards[0, :] = 1.0
    rewards[2, 0] = 1.0
    groups = rewarded_groups(batch, rewards, step=9)
    for g, group in enumerate(groups):
        want, seen = [], set()
        for r in range(g * k, (g + 1) * k):
            n = int(mask[r].sum())
            tok = tuple(tokens[r, :n].tolist())
            if rewards[g, r % k] and tok not in seen:
                seen.add(tok)
                want.append((tok, tuple(batch.old_log_prob[r, :n].tolist()), float(batch.behaviour_entropy[r, :n].mean())))
        assert group.qid == 10 + g and group.num_correct == int(rewards[g].sum())
        got = [(c.tokens, c.behaviour_log_prob, c.entropy) for c in group.correct]
        assert [x[:2] for x in got] == [x[:2] for x in want]
        assert [x[2] for x in got] == pytest.approx([x[2] for x in want])
        assert all(c.step == 9 for c in group.correct)
    assert len(groups[0].correct) < groups[0].num_correct  # rows 1 and 2: one response, kept once
    shared = tuple(tokens[8, :int(mask[8].sum())].tolist())  # row 3's response is row 8's (in group 2)
    assert shared in {c.tokens for c in groups[0].correct} and shared in {c.tokens for c in groups[2].correct}


def _observe(s, groups, step):
    """Let strategy ``s`` (K = 4) see one fresh batch: ``groups`` is [(qid, [rewards of its 4 rows])];
    row i of question q answers with the tokens (q, i)."""
    qids = [q for q, _ in groups]
    tokens = torch.tensor([[q, i] for q in qids for i in range(4)])
    log_prob = torch.tensor([[-0.5 * (1 + (q == 1)), -0.5 * (1 + (q == 1))] for q in qids for _ in range(4)])
    batch = assemble_batch(Replays.empty(), qids, tokens, torch.ones(len(qids) * 4, 2, dtype=torch.bool), log_prob,
                           torch.ones(len(qids) * 4, 2), 4)
    s.observe(batch, torch.tensor([r for _, r in groups], dtype=torch.float), step=step)


@pytest.mark.parametrize("retire", [True, False])
def test_a_solved_question_leaves_the_fresh_pass_only_when_retirement_is_on(retire):
    algo = ExGRPOConfig(group_size=4, replay_start_pass_rate=0.0, retire_solved=retire)
    s = make_replay_strategy(algo, np.random.default_rng(0))
    s.after_step(0.5, step=0)
    _observe(s, [(1, [1, 1, 0, 0]), (2, [1, 1, 1, 1])], step=1)  # q2 solved 4/4
    assert s.retired == ({2} if retire else set()) and s.stats()["pool/retired"] == float(retire)
    fresh = FreshSampler([1, 2, 3], np.random.default_rng(0))
    drawn = {q for _ in range(4) for q in fresh.next(3, s.retired)}
    assert (2 in drawn) is not retire and {1, 3} <= drawn


@pytest.mark.parametrize("store_single", [True, False])
def test_a_success_found_once_in_k_is_stored_only_when_asked_and_replays_are_counted_by_their_groups(store_single):
    algo = ExGRPOConfig(group_size=4, replay_start_pass_rate=0.0, store_single_successes=store_single,
                        selection_metric="random")
    s = make_replay_strategy(algo, np.random.default_rng(0))
    s.after_step(0.5, step=0)
    # q1: one correct of four (a single success, stored log-prob -1.0 a token); q2: two of four (-0.5)
    _observe(s, [(1, [1, 0, 0, 0]), (2, [1, 1, 0, 0])], step=1)
    assert (1 in s.pool) is store_single and s.pool.bucket_of(2) == 2
    assert [t.group_correct for t in s.pool.trajectories(2)] == [2, 2]
    # q2 found once in four later on: it moves to bucket 1, and stores that success only when asked
    _observe(s, [(2, [0, 0, 1, 0])], step=2)
    assert s.pool.bucket_of(2) == 1 and len(s.pool.trajectories(2)) == (3 if store_single else 2)

    s.plan(4)
    replays = s.select(2, lambda q, t, m: (torch.zeros_like(t, dtype=torch.float), torch.zeros_like(t, dtype=torch.float)))
    single = [t.group_correct == 1 for t in replays.trajectories]
    m = s.stats()
    assert m["replay/single_success_share"] == pytest.approx(sum(single) / len(single))
    assert m["replay/single_success_share_run"] == m["replay/single_success_share"]
    if not store_single:  # nothing from a 1-of-4 group was stored, so nothing of the kind is replayed
        assert m["replay/single_success_share"] == 0.0 and "replay/single_success_log_prob" not in m
        assert m["replay/multi_success_log_prob"] == pytest.approx(-0.5)
    elif any(single):  # q1's rows were sampled at -1.0 a token, q2's at -0.5
        lucky = [t for t in replays.trajectories if t.group_correct == 1]
        assert m["replay/single_success_log_prob"] == pytest.approx(
            sum(-1.0 if t.tokens[0] == 1 else -0.5 for t in lucky) / len(lucky))
    # the run's counts survive a resume
    s2 = make_replay_strategy(algo, np.random.default_rng(0))
    s2.load_state_dict(s.state_dict())
    assert s2._run_counts == s._run_counts
    assert [t.group_correct for t in s2.pool.trajectories(2)] == [t.group_correct for t in s.pool.trajectories(2)]
