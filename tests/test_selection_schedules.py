import numpy as np
import pytest
import torch

from exgrpo.config import NotebookReplayConfig, SelectionMetric, SelectionMode
from exgrpo.core.notebook_buffer import NotebookBuffer
from exgrpo.core.pool import Trajectory
from exgrpo.core.schedules import ReplayStartSwitch, notebook_lambda
from exgrpo.core.selection import pad_right, select_per_group, trajectory_metric


def test_selection_picks_lowest_mean_entropy_across_lengths_and_padding():
    # trajectory 0: short, total entropy 1.2 (lowest total) but mean 0.6
    # trajectory 1: long, total 2.0 but mean 0.4 (lowest mean) -> the intended pick
    # trajectory 2: other question
    ent_rows = [[0.6, 0.6], [0.4, 0.4, 0.4, 0.4, 0.4], [0.1]]
    ent, mask = pad_right(ent_rows, pad=9.0, dtype=torch.float32)  # padding must never count
    log_prob = -ent
    values = trajectory_metric(SelectionMetric.ENTROPY, log_prob, ent, mask)
    assert torch.allclose(values, torch.tensor([0.6, 0.4, 0.1]))
    rng = np.random.default_rng(0)
    assert select_per_group(values, [0, 0, 1], SelectionMode.ARGMIN, rng) == [1, 2]
    assert select_per_group(values, [0, 0, 1], SelectionMode.ARGMAX, rng) == [0, 2]
    ppl = trajectory_metric(SelectionMetric.PERPLEXITY, log_prob, ent, mask)
    assert torch.allclose(ppl, torch.exp(torch.tensor([0.6, 0.4, 0.1])))
    picks = {tuple(select_per_group(None, [0, 0, 1], SelectionMode.ARGMIN, np.random.default_rng(s))) for s in range(20)}
    assert picks == {(0, 2), (1, 2)}


def test_replay_start_switch_is_one_way_and_restorable():
    s = ReplayStartSwitch(0.35)
    assert not s.update(0.35, 0)  # strictly greater
    assert s.update(0.36, 1) and s.update(0.0, 2)
    t = ReplayStartSwitch()
    t.load_state_dict(s.state_dict())
    assert t.started and t.started_at_step == 1


def test_notebook_lambda_schedule():
    cfg = NotebookReplayConfig()  # warm 5, peak 25, max 0.5, min 0.2, alpha 0.03, beta 0.01
    assert notebook_lambda(0, cfg) == 0.0 and notebook_lambda(4, cfg) == 0.0
    assert notebook_lambda(10, cfg) == pytest.approx(0.15)
    assert notebook_lambda(24, cfg) == pytest.approx(0.5)
    assert notebook_lambda(35, cfg) == pytest.approx(0.4)
    assert notebook_lambda(100, cfg) == pytest.approx(0.2)


def test_notebook_buffer_caps_priority_and_distinct_questions():
    buf = NotebookBuffer(max_len=4, uid_cap=2, tau=10.0)
    for i in range(3):
        buf.add(1, Trajectory((i,), (-0.1,), 0.1 * i, i))
    assert buf.stats()["pool/trajectories"] == 2  # per-question cap keeps the newest 2
    buf.add(2, Trajectory((7,), (-0.1,), 5.0, 3))
    buf.add(3, Trajectory((8,), (-0.1,), 0.0, 3))
    buf.add(4, Trajectory((9,), (-0.1,), 0.0, 0))
    assert len(buf) == 4  # capacity evicts the oldest
    picked = buf.sample(per=10, step=3)
    assert len({q for q, _ in picked}) == len(picked)
    assert picked[0][0] == 3  # recent and confident first
    other = NotebookBuffer(4, 2, 10.0)
    other.load_state_dict(buf.state_dict())
    assert other.sample(10, 3) == picked


def test_notebook_buffer_samples_in_proportion_to_priority():
    buf = NotebookBuffer(max_len=10, uid_cap=1, tau=1e9)
    buf.add(1, Trajectory((1,), (-0.1,), 0.0, 0))  # priority 1 / (1 + 0) = 1
    buf.add(2, Trajectory((2,), (-0.1,), 3.0, 0))  # priority 1 / (1 + 3) = 0.25
    assert [q for q, _ in buf.sample(per=1, step=0)] == [1]  # top: always the highest
    rng = np.random.default_rng(0)
    firsts = [buf.sample(per=1, step=0, rng=rng)[0][0] for _ in range(4000)]
    assert firsts.count(2) / len(firsts) == pytest.approx(0.25 / 1.25, abs=0.02)
    both = buf.sample(per=2, step=0, rng=rng)
    assert sorted(q for q, _ in both) == [1, 2]  # without replacement, distinct questions
