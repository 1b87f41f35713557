"""Everything that scores responses: dynamic/static rubrics, scalar reward models, LLM-as-judge protocols, prompts.

Evaluators register themselves under the registry kind "evaluator" with a factory
`build(settings: dict[str, str], pool: BackendPool) -> Evaluator`; `load_evaluator(spec, pool)` parses a spec string
and builds one. Importing this package imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.pool import BackendPool
    from judges.base import Evaluator

_EVALUATOR_MODULES = ("judges.dynamic", "judges.scalar_rm", "judges.pairwise")


def register_all() -> None:
    """Import every evaluator module so each registers its kind."""
    import importlib

    for name in _EVALUATOR_MODULES:
        importlib.import_module(name)


def load_evaluator(spec: str, pool: BackendPool) -> Evaluator:
    """Build the evaluator a spec names (`KIND[:key=value,...]`, see `judges.base`)."""
    from harness.registry import lookup
    from judges.base import parse_evaluator_spec

    register_all()
    kind, settings = parse_evaluator_spec(spec)
    return lookup("evaluator", kind)(settings, pool)
