"""The shared fixtures of tests/conftest.py do what the tests that lean on them assume."""

import os


def test_exgrpo_cache_builds_the_tiny_lm_once_for_the_whole_run(exgrpo_cache, request, monkeypatch):
    """One directory for the pytest run (the same object wherever it is asked for), in which a
    second load of a warm start is a cache hit."""
    from exgrpo.backends.native.lm.tiny_lm import TinyLMConfig, load_tiny_lm

    assert exgrpo_cache.is_dir() and request.getfixturevalue("exgrpo_cache") is exgrpo_cache
    fixturedef = request._fixturemanager.getfixturedefs("exgrpo_cache", request.node)[-1]
    assert fixturedef.scope == "session"
    monkeypatch.setenv("EXGRPO_CACHE", str(exgrpo_cache))
    cfg = TinyLMConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, sft_steps=2,
                       sft_batch_size=8, sft_warmup=1, eval_questions=8, eval_max_new_tokens=8)
    load_tiny_lm(cfg, progress=False)
    again = load_tiny_lm(cfg, progress=False)
    assert again.cache_hit and os.path.commonpath([again.path, exgrpo_cache]) == str(exgrpo_cache)
