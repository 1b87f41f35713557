"""Model-major scheduling: which local models are resident while which units of a run go.

A run's units each need a set of local models (the models that run in this process: `hf`, `vllm`; a served model
costs this machine nothing). Local models share one device budget: in-process engines all use the process's
devices, so each takes its share of every device it spans. The scheduler orders the distinct model sets so that
sets sharing models are neighbours, then packs neighbours into *phases* whose models fit the budget together.
Units run phase by phase; within a phase they run concurrently as before. After a phase, the models the next
phase does not need are released (their memory freed); a model shared by consecutive phases (the verifier of
several rubric rows) stays resident. Without a budget there is one phase: every model may be resident at once.

A model set that does not fit the budget even alone cannot run: `schedule` raises `DoesNotFit`, which names
the models, their sizes and the budget, so the plan can say what to change (serve it, more devices, a larger
tensor-parallel size).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from harness.errors import ConfigError


class DoesNotFit(ConfigError):
    """A set of models one unit needs together is larger than the device budget."""


@dataclass(frozen=True, slots=True)
class Phase:
    """Units whose model sets run together, and the local models resident while they do."""

    models: frozenset[str]
    """Every local model of the phase (the union of its groups)."""
    groups: tuple[frozenset[str], ...]
    """The distinct model sets of the units that run in this phase."""
    release_after: frozenset[str]
    """Models freed when the phase ends: those the next phase does not need (none after the last: the run's
    end closes everything)."""


def schedule(groups: Iterable[frozenset[str]], *, cost: Mapping[str, float],
             budget: float | None) -> list[Phase]:
    """Phases for the distinct model sets `groups` (see the module docstring).

    Args:
        groups: Each unit's set of local models (repeats and empty sets allowed: an empty set joins the first
            phase).
        cost: Model -> what it takes of the budget while resident (per device).
        budget: What a device offers; None: unbounded (one phase).

    Raises:
        DoesNotFit: for a model set larger than the budget alone.
    """
    groups = list(groups)
    distinct = [g for g in dict.fromkeys(groups) if g]
    if not distinct:
        return [Phase(frozenset(), (frozenset(),), frozenset())]
    need = {g: sum(cost.get(m, 0.0) for m in g) for g in distinct}
    if budget is not None:
        for g in distinct:
            if need[g] > budget:
                sizes = ", ".join(f"{m} {cost.get(m, 0.0):.1f}" for m in sorted(g))
                raise DoesNotFit(f"models needed together ({sizes}; {need[g]:.1f} in all) exceed the budget of "
                                 f"{budget:.1f} per device")
    packed: list[list[frozenset[str]]] = []
    resident: frozenset[str] = frozenset()
    for g in _chain(distinct):
        if packed and (budget is None or sum(cost.get(m, 0.0) for m in resident | g) <= budget):
            packed[-1].append(g)
            resident |= g
        else:
            packed.append([g])
            resident = g
    models = [frozenset().union(*p) for p in packed]
    phases = []
    for i, p in enumerate(packed):
        following = models[i + 1] if i + 1 < len(packed) else models[i]
        phases.append(Phase(models[i], tuple(p), models[i] - following))
    if frozenset() in groups:  # units that need no local model go first
        first = phases[0]
        phases[0] = Phase(first.models, (frozenset(), *first.groups), first.release_after)
    return phases


def _chain(groups: Sequence[frozenset[str]]) -> list[frozenset[str]]:
    """`groups` ordered so that each shares as many models as possible with the one before it, starting with
    the group whose models the others share most (ties keep the given order)."""
    shared = {g: sum(len(g & other) for other in groups if other is not g) for g in groups}
    left = list(groups)
    order = [max(left, key=lambda g: (shared[g], -left.index(g)))]
    left.remove(order[0])
    while left:
        best = max(left, key=lambda g: (len(g & order[-1]), shared[g], -left.index(g)))
        order.append(best)
        left.remove(best)
    return order


def phase_of(phases: Sequence[Phase], group: frozenset[str]) -> int:
    """The index of the phase a unit with model set `group` runs in."""
    for i, phase in enumerate(phases):
        if group in phase.groups:
            return i
    raise KeyError(f"no phase runs the model set {sorted(group)}")
