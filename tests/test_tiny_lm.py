"""Tiny-lm tier: character tokenizer, text-arithmetic task and reward, cached SFT warm start."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from exgrpo.config import ConfigError, load_experiment
from exgrpo.config.tasks import distinct_questions, rl_questions_bound
from exgrpo.tasks.tokenizers import DEFAULT_CHARS, CharTokenizer
from exgrpo.core.selection import pad_right
from exgrpo.tasks.text_arithmetic import (
    ArithmeticProblemsConfig,
    TextArithmetic,
    TextArithmeticTaskConfig,
    extract_final_integer,
    is_rl_question,
    question_text,
    sample_problem,
    sample_sft_problems,
    worked_solution,
)
from exgrpo.tasks.secret_gold import secret_answers

SMALL_TASK = TextArithmeticTaskConfig(n_train=200, n_val=50, data_seed=7)


# ---------------------------------------------------------------------------------- tokenizer
def test_tokenizer_round_trip(tmp_path):
    tok = CharTokenizer()
    assert tok.vocab_size < 64 and tok.vocab_size == 4 + len(DEFAULT_CHARS)
    text = "12+7*3=? 7*3=21 12+21=33 \\boxed{33} (x-1)/2, ok: -5."
    ids = tok.encode(text, add_bos=True, add_eos=True, strict=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and len(ids) == len(text) + 2
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=False) == "<bos>" + text + "<eos>"
    assert tok.decode(tok.encode(DEFAULT_CHARS)) == DEFAULT_CHARS
    assert tok.encode("1#2") == [tok.token_to_id["1"], tok.unk_id, tok.token_to_id["2"]]
    with pytest.raises(ValueError):
        tok.encode("1#2", strict=True)
    tok.save(tmp_path)
    assert CharTokenizer.load(tmp_path) == tok


# ---------------------------------------------------------------------------------- task
@pytest.mark.parametrize(
    "text,value",
    [
        ("7*3=21 12+21=33 \\boxed{33}", 33),
        ("4-38=-34 -34+11=-23 \\boxed{-23}", -23),
        ("\\boxed{5} then \\boxed{ 8 }", None),  # distinct boxes: a hedge, no answer
        ("\\boxed{8} then \\boxed{ 8 }", 8),
        ("\\boxed{12} \\boxed{1", 12),  # an unterminated last box falls back to the previous box
        ("\\boxed{x}", None),
        ("\\boxed{}", None),
        ("12+21=33", None),  # strict: no box, no answer
        ("\\boxed{４２}", None),  # non-ASCII digits
        ("no digits", None),
        ("", None),
    ],
)
def test_extract_final_integer(text, value):
    assert extract_final_integer(text) == value


def test_worked_solutions_are_correct():
    cfg = ArithmeticProblemsConfig()
    rng = np.random.default_rng(0)
    for _ in range(300):
        nums, ops = sample_problem(cfg, rng)
        q = question_text(nums, ops)
        sol, ans = worked_solution(nums, ops)
        assert ans == eval(q.removesuffix("=?"))  # noqa: S307 - our own digits and +-* only
        assert sol.endswith(f"\\boxed{{{ans}}}") and extract_final_integer(sol) == ans
    assert worked_solution([12, 7, 3], ["+", "*"]) == ("7*3=21 12+21=33 \\boxed{33}", 33)
    assert worked_solution([2, 3, 4], ["*", "*"]) == ("2*3=6 6*4=24 \\boxed{24}", 24)


def test_a_mixed_strategy_warm_start_draws_direct_answers_and_leaves_the_worked_stream_alone():
    from exgrpo.policies.lm.tiny_lm import TinyLMConfig, config_hash
    from exgrpo.tasks.text_arithmetic import direct_solution

    assert direct_solution([12, 7, 3], ["+", "*"]) == "\\boxed{33}"
    cfg = ArithmeticProblemsConfig()
    worked = sample_sft_problems(cfg, np.random.default_rng(0), 400)
    assert sample_sft_problems(cfg, np.random.default_rng(0), 400, 0.0) == worked  # the option off: the same stream
    mixed = sample_sft_problems(cfg, np.random.default_rng(0), 400, 0.6)
    direct = [s for _, s in mixed if s.startswith("\\boxed")]
    assert 0.5 < len(direct) / len(mixed) < 0.7
    assert all(extract_final_integer(s) == eval(q.removesuffix("=?")) for q, s in mixed)  # noqa: S307
    # caches made before the option keep their key; a warm start with it is another model
    assert config_hash(TinyLMConfig()) == "5d59d3766d131804"  # the key of every cache made before it
    assert config_hash(TinyLMConfig(sft_direct_fraction=0.6)) != config_hash(TinyLMConfig())


def test_task_splits_prompts_and_determinism():
    a, b = TextArithmetic(SMALL_TASK), TextArithmetic(SMALL_TASK)
    assert a.questions == b.questions and a.train_ids == b.train_ids and a.val_ids == b.val_ids
    assert len(a.train_ids) == 200 and len(a.val_ids) == 50 and not set(a.train_ids) & set(a.val_ids)
    assert len(set(a.questions)) == len(a.questions) and all(is_rl_question(q) for q in a.questions)
    c = TextArithmetic(SMALL_TASK.model_copy(update={"data_seed": 8}))
    assert c.questions != a.questions
    # the SFT side never produces an RL question
    sft = sample_sft_problems(ArithmeticProblemsConfig(), np.random.default_rng(0), 500)
    assert not any(is_rl_question(q) for q, _ in sft)
    p = a.prompts([3, 3, 0])
    assert p[0] == p[1] and p[0][0] == a.tokenizer.bos_id and a.tokenizer.decode(p[2]) == a.questions[0]


def test_the_test_split_is_new_questions_and_leaves_training_and_tuning_as_they_were():
    tuning = TextArithmetic(SMALL_TASK)
    test = TextArithmetic(SMALL_TASK.model_copy(update={"held_out": "test"}))
    assert test.train_ids == tuning.train_ids and test.tuning_ids == tuning.val_ids
    assert test.questions[: len(tuning.questions)] == tuning.questions  # the same training and tuning questions
    held = {test.questions[i] for i in test.val_ids}
    assert len(held) == len(test.val_ids) == SMALL_TASK.n_val
    assert not held & {test.questions[i] for i in test.train_ids + test.tuning_ids}
    assert TextArithmetic(SMALL_TASK.model_copy(update={"held_out": "test"})).val_ids == test.val_ids  # fixed by data_seed
    from exgrpo.sweep.space import SweepError, load_sweep

    with pytest.raises(SweepError, match="task.held_out: a sweep chooses on what it reads"):
        load_sweep("experiments/tiny-lm-chain-sweep.yaml", {"base.task.held_out": "test"})


def all_questions(p: ArithmeticProblemsConfig) -> set[str]:
    """Every question ``p`` can make, written out (small distributions only)."""
    out = set()
    for n in range(p.min_operands, p.max_operands + 1):
        for ops in itertools.product(sorted(set(p.ops)), repeat=n - 1):
            by_mul = [(i > 0 and ops[i - 1] == "*") or (i < n - 1 and ops[i] == "*") for i in range(n)]
            ranges = [range((p.max_factor if m else p.max_operand) + 1) for m in by_mul]
            out |= {question_text(nums, ops) for nums in itertools.product(*ranges)}
    return out


@pytest.mark.parametrize("problems", [
    {}, {"max_operand": 3, "max_factor": 2}, {"max_operand": 5, "max_factor": 3, "max_operands": 4},
    {"min_operands": 3, "max_operands": 3, "max_operand": 9, "ops": "+-"}, {"max_operand": 1, "ops": "+", "max_operands": 2},
])
def test_the_questions_a_distribution_makes_are_counted_and_the_rl_side_bounded(problems):
    p = ArithmeticProblemsConfig(**problems)
    every = all_questions(p)
    rng = np.random.default_rng(0)
    assert all(question_text(*sample_problem(p, rng)) in every for _ in range(500))
    assert distinct_questions(p) == len(every)
    assert sum(map(is_rl_question, every)) <= rl_questions_bound(p) <= len(every)


def test_a_task_asking_for_more_questions_than_its_distribution_makes_is_refused_before_any_work():
    with pytest.raises(ConfigError, match=r"task\.n_train=50000 .*lower task\.n_train") as e:
        load_experiment("experiments/tiny-lm.yaml", {"task.n_train": 50000})
    assert len(str(e.value).splitlines()) == 2  # the source, then one line on the field and the fix
    # the default distribution makes 47426 questions, 23806 of them on the RL side
    fits = {"task.n_train": 20000, "task.n_val": 3000}
    assert load_experiment("experiments/tiny-lm.yaml", fits).task.n_train == 20000
    with pytest.raises(ConfigError, match=r"task\.n_val=3000 twice \(held_out: test\) asks for 26000"):
        load_experiment("experiments/tiny-lm.yaml", {**fits, "task.held_out": "test"})


def test_task_rewards_on_constructed_strings():
    task = TextArithmetic(SMALL_TASK)
    tok = task.tokenizer
    q = task.val_ids[:4]
    gold = [task.answers[i] for i in q]
    texts = [
        task.solution_text(q[0]),  # the worked solution: correct
        f"1+1=2 \\boxed{{{gold[1] + 1}}}",  # wrong box
        f"the answer is {gold[2]}",  # no box: no answer (strict)
        f"\\boxed{{{gold[3]}}} junk 999",  # box wins over a later integer
    ]
    seqs = [tok.encode(t, add_eos=True) for t in texts]
    seqs[2] = seqs[2][:-1]  # a truncated row (no EOS)
    tokens, mask = pad_right(seqs, pad=tok.pad_id)
    r = task.rewards(q, tokens, mask)
    assert r.dtype == torch.float32 and r.tolist() == [1.0, 0.0, 0.0, 1.0]
    # tokens beyond the mask are ignored
    tokens2 = tokens.clone()
    tokens2[~mask] = tok.encode("7")[0]
    assert task.rewards(q, tokens2, mask).tolist() == [1.0, 0.0, 0.0, 1.0]


def test_a_secret_gold_is_the_result_moved_by_a_fixed_offset_that_only_memory_finds():
    """gold: secret (the constructed control for replay): each question's graded answer is its result
    moved by ±1..±spread, fixed by data_seed and the question, the same in every split; the worked
    solution, which computes the result, scores 0, and the secret scores 1."""
    plain = TextArithmetic(SMALL_TASK)
    secret = TextArithmetic(SMALL_TASK.model_copy(update={"gold": "secret", "secret_spread": 3}))
    assert secret.questions == plain.questions
    moved = [s - r for s, r in zip(secret.answers, plain.answers, strict=True)]
    assert set(moved) == {-3, -2, -1, 1, 2, 3}
    test = TextArithmetic(SMALL_TASK.model_copy(update={"gold": "secret", "secret_spread": 3, "held_out": "test"}))
    assert test.answers[: len(secret.answers)] == secret.answers  # a question keeps its secret in every split
    assert secret_answers(plain.questions, plain.answers, 3, seed=8) != secret.answers  # another data_seed, other secrets
    q = secret.train_ids[:2]
    texts = [secret.solution_text(q[0]), f"\\boxed{{{secret.answers[q[1]]}}}"]
    tokens, mask = pad_right([secret.tokenizer.encode(t, add_eos=True) for t in texts], pad=secret.tokenizer.pad_id)
    assert secret.rewards(q, tokens, mask).tolist() == [0.0, 1.0]


# ---------------------------------------------------------------------------------- tiny LM
def test_tiny_sft_runs_and_caches(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from exgrpo.policies.lm.tiny_lm import TinyLMConfig, config_hash, load_tiny_lm

    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    cfg = TinyLMConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, sft_steps=4,
        sft_batch_size=8, sft_warmup=1, eval_questions=8, eval_max_new_tokens=8,
    )
    first = load_tiny_lm(cfg, progress=False)
    assert not first.cache_hit and first.path == tmp_path / "tiny-lm" / config_hash(cfg)
    for name in ("config.json", "model.safetensors", "char_vocab.json", "tiny_lm.json"):
        assert (first.path / name).is_file(), name
    rec = first.record
    assert len(rec["sft_loss_curve"]) >= 1 and np.isfinite(rec["sft_final_loss"])
    assert 0 <= rec["warm_start_accuracy"] <= 1

    second = load_tiny_lm(cfg, progress=False)
    assert second.cache_hit and second.tokenizer == first.tokenizer and second.record == rec
    for (n1, p1), (n2, p2) in zip(first.model.state_dict().items(), second.model.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2), n1
    # a different config is a different cache entry
    assert config_hash(cfg.model_copy(update={"sft_steps": 5})) != config_hash(cfg)
    assert config_hash(cfg.model_copy(update={"eval_questions": 3})) == config_hash(cfg)


def test_lm_policy_runs_a_trainer_step(tmp_path):
    """The tiny-lm pieces plug into the backend-agnostic trainer unchanged."""
    pytest.importorskip("transformers")
    from exgrpo.policies.lm.policy import LMPolicy, LMPolicyConfig
    from exgrpo.policies.lm.tiny_lm import TinyLMConfig, build_model
    from exgrpo.backends.native.trainer import Trainer
    from exgrpo.config import ExperimentConfig

    task = TextArithmetic(SMALL_TASK)
    small = TinyLMConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    model = build_model(small, task.tokenizer)
    policy = LMPolicy(model, task.tokenizer.pad_id, task.tokenizer.eos_id, LMPolicyConfig(max_new_tokens=12))
    cfg = ExperimentConfig.model_validate(
        {"output_dir": str(tmp_path), "train": {"batch_size": 4, "max_steps": 2}, "algorithm": {"group_size": 4}}
    )
    trainer = Trainer(cfg, task=task, policy=policy)
    before = [p.detach().clone() for p in policy.parameters()]
    m = trainer.train_step()
    assert np.isfinite(m["actor/grad_norm"]) and 0 <= m["batch/solved"] <= 1
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    assert 0 <= trainer.evaluate()["val/accuracy"] <= 1


SMALL_LM = {"policy.model.hidden_size": 32, "policy.model.num_layers": 1, "policy.model.num_heads": 2,
            "policy.model.num_kv_heads": 1, "policy.model.intermediate_size": 64, "policy.model.sft_steps": 4,
            "policy.model.sft_batch_size": 8, "policy.model.sft_warmup": 1, "policy.model.eval_questions": 8,
            "policy.model.eval_max_new_tokens": 8}


def test_a_command_says_whether_the_warm_start_was_cached_or_trained_now(tmp_path, monkeypatch):
    """`make demo` (a comparison) and `exgrpo train` say in one line whether the SFT warm start was in the
    cache (a cached one saves the demo its SFT), with its path; one to be trained is
    announced before its training, with roughly how long it takes."""
    pytest.importorskip("transformers")
    from exgrpo.policies.lm.tiny_lm import cache_root, config_hash
    from exgrpo.compare import jobs, prepare_warm_starts
    from exgrpo.config import load_compare, load_experiment

    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    cc = load_compare("experiments/tiny-lm.yaml", SMALL_LM)
    configs = [cfg for cfg, _ in jobs(cc)]  # every arm and seed: one model, one line
    path = cache_root() / "tiny-lm" / config_hash(configs[0].policy.model)
    said: list[str] = []
    cached_when_said: list[bool] = []

    def say(line: str) -> None:
        said.append(line)
        cached_when_said.append((path / "tiny_lm.json").is_file())

    prepare_warm_starts(configs, say=say, progress=False)
    announced, trained = said  # the first before training (silent without a progress bar), how long roughly
    assert cached_when_said == [False, True]
    assert announced == ("tiny LM warm start: not in the cache, training it now: 4 SFT steps, under a minute "
                         "(approximate: about 0.05-0.3 s a step on a 2-core CPU)")
    assert trained.startswith("tiny LM warm start: trained now in ") and trained.endswith(
        f" s (not in the cache); cached at {path} for the next runs")
    assert (path / "tiny_lm.json").is_file()
    said.clear()
    prepare_warm_starts(configs, say=said.append, progress=False)
    assert said == [f"tiny LM warm start: loaded from the cache, {path}"]
    said.clear()
    prepare_warm_starts([load_experiment("experiments/toy-grpo.yaml")], say=said.append)  # no LM: nothing to say
    assert said == []


def test_the_warm_start_estimate_grows_with_its_sft_steps():
    from exgrpo.policies.lm.tiny_lm import TinyLMConfig, sft_estimate

    assert sft_estimate(TinyLMConfig(sft_steps=4)) == "under a minute"
    assert sft_estimate(TinyLMConfig()) == "roughly 20 s-2 min"  # the default 400 steps
    assert sft_estimate(TinyLMConfig(sft_steps=2000)) == "roughly 2-10 min"


def test_the_warm_start_is_the_same_whatever_thread_count_its_caller_runs_at(tmp_path, monkeypatch):
    """The cache key is the config alone, so the weights may not depend on the caller's torch threads
    (a float sum split over 3 threads rounds otherwise than over 1): trained at SFT_THREADS from callers
    at 1 and 3 threads, bit for bit the same, and each caller keeps its own count. A cache entry that
    says it was trained at another count is trained again."""
    pytest.importorskip("transformers")
    from exgrpo.policies.lm.tiny_lm import RECORD_FILE, SFT_THREADS, TinyLMConfig, load_tiny_lm, train_tiny_lm, warm_start

    cfg = TinyLMConfig(sft_steps=3, eval_questions=0)  # the default model: its sums are big enough to split
    caller = torch.get_num_threads()
    weights = {}
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            tiny = train_tiny_lm(cfg, progress=False)
            assert torch.get_num_threads() == threads and tiny.record["torch_threads"] == SFT_THREADS
            weights[threads] = tiny.model.state_dict()
    finally:
        torch.set_num_threads(caller)
    assert weights[1].keys() == weights[3].keys()
    assert all(torch.equal(weights[1][k], weights[3][k]) for k in weights[1]), "the weights depend on the threads"

    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    path = load_tiny_lm(cfg, progress=False).path
    record = json.loads((path / RECORD_FILE).read_text())
    (path / RECORD_FILE).write_text(json.dumps({**record, "torch_threads": 3}))  # an entry trained at 3 threads
    said: list[str] = []
    line = warm_start(cfg, progress=False, say=said.append)
    assert said[0].startswith("tiny LM warm start: the cached one was trained at another thread count than 1, training")
    assert line.startswith("tiny LM warm start: trained now in ")
    assert json.loads((path / RECORD_FILE).read_text())["torch_threads"] == SFT_THREADS
    assert load_tiny_lm(cfg, progress=False).cache_hit


def test_a_cached_verl_export_is_found_without_loading_the_model(tmp_path, monkeypatch):
    """veRL's copy of the tiny LM (``hf-verl`` in its cache entry) is found from the cache key alone: no
    transformers import, no model load in the launching command (seconds of CPU a run); without that copy
    the model is loaded and exported."""
    from exgrpo.backends.verl.assets import export_model
    from exgrpo.policies.lm import tiny_lm

    cfg = load_experiment("experiments/verl-tiny-grpo.yaml")
    monkeypatch.setenv("EXGRPO_CACHE", str(tmp_path))
    entry = tmp_path / "tiny-lm" / tiny_lm.config_hash(cfg.policy.model)
    (entry / "hf-verl").mkdir(parents=True)
    (entry / tiny_lm.RECORD_FILE).write_text(json.dumps({"torch_threads": tiny_lm.SFT_THREADS}))

    def load(*args, **kwargs):
        raise AssertionError("the tiny LM was loaded")

    monkeypatch.setattr(tiny_lm, "load_tiny_lm", load)
    with pytest.raises(AssertionError, match="was loaded"):  # no export yet: loaded to make one
        export_model(cfg)
    (entry / "hf-verl" / "tokenizer.json").write_text("{}")
    assert export_model(cfg) == entry / "hf-verl"
