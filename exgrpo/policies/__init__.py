"""The policies both backends train, and what a policy and a task offer the step (:mod:`.interfaces`).

* :mod:`.build` -- :func:`~exgrpo.policies.build.build_task_and_policy`: a config's task and policy.
* :mod:`.inputs` -- :func:`~exgrpo.policies.inputs.check_inputs`: the local model and question files a
  run reads, checked before any work.
* :mod:`.mlp_policy` -- the toy tier's MLP over feature vectors.
* :mod:`.lm` -- the LM tiers: the tiny LM (SFT warm start) and a local Hugging Face model (SmolLM2-135M
  among them, :mod:`.lm.hf_model`), the rollout engine that samples and scores them (also veRL's CPU
  rollout), and :class:`~exgrpo.policies.lm.policy.LMPolicy`.
"""
