"""Everything that scores responses: dynamic/static rubrics, scalar reward models, LLM-as-judge protocols, prompts.

Evaluators are catalogued (`harness.catalog`) under the registry kind "evaluator" as a factory
`build(settings: dict[str, str], pool: BackendPool) -> Evaluator`; `load_evaluator(spec, pool)` parses a spec string
and builds one. A policy benchmark's judge is catalogued under the kind "judge" by the benchmark's name
(`judges.policy`). Importing this package imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.pool import BackendPool
    from judges.base import Evaluator

def held_fixed(spec: str) -> tuple[str, str | None, dict[str, str]]:
    """What a comparison of two runs of one row may change, and what it must keep.

    Returns:
        (kind, subject, fixed): `subject` is the value of the setting under test (the evaluator module's
        `SUBJECT`: the generator checkpoint of a rubric evaluator, the reward model of `scalar-rm`), `fixed`
        every other setting with implicit values made explicit (the module's `explicit_settings`, e.g. a
        rubric evaluator's verifier defaulting to its generator). Two runs compare only if their `fixed` agree.
    """
    import sys

    from harness.registry import lookup
    from judges.base import parse_evaluator_spec

    kind, settings = parse_evaluator_spec(spec)
    module = sys.modules[lookup("evaluator", kind).__module__]
    explicit = getattr(module, "explicit_settings", dict)(settings)
    subject = getattr(module, "SUBJECT", None)
    return kind, explicit.pop(subject, None) if subject else None, explicit


def load_evaluator(spec: str, pool: BackendPool) -> Evaluator:
    """Build the evaluator a spec names (`KIND[:key=value,...]`, see `judges.base`)."""
    from harness.registry import lookup
    from judges.base import parse_evaluator_spec

    kind, settings = parse_evaluator_spec(spec)
    return lookup("evaluator", kind)(settings, pool)
