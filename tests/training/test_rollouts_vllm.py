"""The generator's rollouts on vLLM's real engine: the `structured_outputs` TRL passes to vLLM
(`training.rollouts.vllm_generation_kwargs`, turned into `StructuredOutputsParams` as TRL's colocate mode does)
make SmolLM2's rubrics parse; the same samples without them do not. Runs in the vLLM environment (`make
test-vllm`), which has no TRL: this is the seam TRL hands the grammar through."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU build otherwise claims most of the RAM

from vllm_servers import smollm2_checkpoint  # noqa: E402

from judges.dynamic import dynamic_generator_prompt  # noqa: E402
from judges.rubric import RubricParseError, parse_rubric  # noqa: E402
from training.rollouts import rollout_constraint, vllm_generation_kwargs  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

QUESTION = "How do I keep basil fresh for a week?"
SET = ["Put the stems in a glass of water on the counter.", "Refrigerate it in a sealed bag.",
       "Basil cannot be kept fresh."]


def _parsed(texts: list[str]) -> int:
    count = 0
    for text in texts:
        try:
            parse_rubric(text)
            count += 1
        except RubricParseError:
            pass
    return count


def test_vllm_rollouts_under_the_structured_outputs_trl_passes_all_parse():
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    model = str(smollm2_checkpoint())
    tokenizer = AutoTokenizer.from_pretrained(model)
    text = dynamic_generator_prompt(QUESTION, SET, [0, 1, 2])
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=False)
    prompt = {"prompt_token_ids": tokenizer(ids, add_special_tokens=False)["input_ids"]}
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
              gpu_memory_utilization=0.3)
    budget = 96
    kwargs = vllm_generation_kwargs(rollout_constraint(budget))
    common = dict(n=8, temperature=1.0, max_tokens=budget, seed=0)
    masked = SamplingParams(**common, structured_outputs=StructuredOutputsParams(**kwargs["structured_outputs"]))
    [with_grammar] = llm.generate([prompt], masked)
    [free] = llm.generate([prompt], SamplingParams(**common))
    texts = [o.text for o in with_grammar.outputs]
    assert _parsed(texts) == 8, texts
    assert _parsed([o.text for o in free.outputs]) < 8
