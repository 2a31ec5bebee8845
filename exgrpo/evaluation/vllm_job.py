"""Generation with vLLM in the job environment (``make job-env``): what the paper's evaluation runs.

    <job python> -m exgrpo.evaluation.vllm_job REQUEST.json OUT.json

``REQUEST``: ``model`` (an HF directory), ``prompts`` (token ids per prompt), ``n``, ``temperature``
(0: greedy), ``top_p``, ``max_tokens``, ``seed``, ``max_model_len``, ``dtype``. ``OUT``: ``outputs``,
the ``n`` responses' token ids per prompt, written atomically. Run by
:func:`exgrpo.evaluation.hf_eval.generate`; imports nothing of exgrpo that needs the orchestrator's
packages (the job environment has no MLflow or Prefect).
"""

from __future__ import annotations

import json
import sys

from exgrpo.atomic import write_text_atomic


def main(request_file: str, out_file: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    req = json.loads(open(request_file).read())
    llm = LLM(model=req["model"], tokenizer=req["model"], dtype=req.get("dtype", "auto"), seed=req["seed"],
              max_model_len=req["max_model_len"], enforce_eager=True, enable_prefix_caching=False)
    greedy = req["temperature"] == 0.0
    params = SamplingParams(n=1 if greedy else req["n"], temperature=req["temperature"],
                            top_p=1.0 if greedy else req["top_p"], max_tokens=req["max_tokens"], seed=req["seed"])
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    outputs = [[list(c.token_ids) for c in r.outputs] for r in results]
    write_text_atomic(out_file, json.dumps({"outputs": outputs}))


if __name__ == "__main__":  # vLLM spawns its engine core, which re-imports this module
    main(sys.argv[1], sys.argv[2])
