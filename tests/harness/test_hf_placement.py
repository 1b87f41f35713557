"""`hf:` placement matches the plan: with `device=auto` over several GPUs a model loads `balanced` within the plan's
even share of each GPU (no longer `sequential`, which filled GPU 0 first); CPU placement is unchanged.

The GPUs are fakes: `torch.cuda`'s device count and free memory are monkeypatched, and transformers computes its
device map for a model on the meta device (nothing is allocated).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from harness.backends.local import check_placed, device_map, even_max_memory, hf_placement  # noqa: E402
from harness.errors import BackendUnavailableError  # noqa: E402

GIB = 2**30


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """`fake(n, free_gib)`: n visible CUDA devices with `free_gib` free on each (a list: per device)."""

    def fake(n: int, free_gib: float | list[float] = 80.0) -> None:
        free = free_gib if isinstance(free_gib, list) else [free_gib] * n
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=0: (int(free[d] * GIB), int(80 * GIB)))

    return fake


def test_auto_over_several_gpus_is_balanced_within_an_even_share(gpus):
    gpus(4)
    placed = hf_placement("auto", "cuda", max_memory=even_max_memory(4, 5.5))
    assert placed == {"device_map": "balanced", "max_memory": {d: int(5.5 * GIB) for d in range(4)}}
    assert hf_placement("auto", "cuda") == {"device_map": "balanced"}  # no plan: transformers' own even split
    assert device_map("auto", "cuda") == "balanced"


def test_cpu_placement_is_unchanged():
    assert hf_placement("auto", "cpu", max_memory=even_max_memory(4, 5.5)) == {}
    assert device_map("auto", "cpu") is None and device_map("cpu", "cpu") is None


def test_one_gpu_or_a_pinned_one_takes_the_whole_model(gpus):
    gpus(1)
    assert hf_placement("auto", "cuda", max_memory=even_max_memory(1, 5.5)) == {"device_map": "cuda"}
    gpus(4)
    assert hf_placement("cuda:2", "cuda:2", max_memory=even_max_memory(4, 5.5)) == {"device_map": "cuda:2"}


def test_the_share_is_cut_to_the_visible_gpus_and_to_what_is_free(gpus):
    gpus(3, [80.0, 2.0, 80.0])
    placed = hf_placement("auto", "cuda", max_memory=even_max_memory(4, 5.5))
    assert placed["max_memory"] == {0: int(5.5 * GIB), 1: 2 * GIB, 2: int(5.5 * GIB)}


def _meta_model(layers: int = 16):
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                                            num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2))


def _bytes_per_device(model, placed: dict[str, object]) -> dict[object, int]:
    sizes: dict[object, int] = {}
    for name, p in model.named_parameters():
        owner = next(m for m in placed if name == m or name.startswith(m + ".") or m == "")
        sizes[placed[owner]] = sizes.get(placed[owner], 0) + p.numel() * p.element_size()
    return sizes


def test_transformers_spreads_the_model_within_the_share_not_onto_gpu_0(gpus):
    """transformers' own device map for 4 fake GPUs of 80 GiB: `sequential` (the old placement) puts the whole
    model on GPU 0; the placement now used spreads it over all four, each GPU within the plan's share and within
    transformers' balanced cap (weights / GPUs plus 1.25 x its largest layer)."""
    from transformers.integrations.accelerate import _get_device_map

    gpus(4)
    model = _meta_model()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    share_gib = weights / 4 / GIB * 1.5  # the plan: weights / devices plus an allowance
    placed = hf_placement("auto", "cuda", max_memory=even_max_memory(4, share_gib))
    layout = _bytes_per_device(model, _get_device_map(model, placed["device_map"], dict(placed["max_memory"]), None))
    assert set(layout) == {0, 1, 2, 3}  # every GPU, nothing on cpu or disk
    assert all(b <= share_gib * GIB for b in layout.values())
    layer = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    assert all(b <= weights / 4 + 1.25 * layer for b in layout.values())  # transformers' balanced cap

    free = {d: 80 * GIB for d in range(4)}  # what `sequential` reads without a max_memory
    old = _bytes_per_device(model, _get_device_map(model, "sequential", free, None))
    assert old == {0: weights}


def test_a_model_placed_partly_off_the_gpus_is_refused():
    class Placed:
        hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "disk", "lm_head": "cpu"}

    with pytest.raises(BackendUnavailableError, match=r"of its 4 placed modules, 1 to cpu, 1 to disk"):
        check_placed(Placed(), "hf model 'big'")
    Placed.hf_device_map = {"model": 0, "lm_head": 1}
    check_placed(Placed(), "hf model 'big'")


def test_the_hf_backend_loads_with_the_plans_share(tmp_path: Path, gpus, monkeypatch: pytest.MonkeyPatch):
    """The run's scheduler gives an `hf:` model its planned share of each GPU; the backend loads `balanced`
    within it, and refuses a placement that spilled to disk."""
    from tiny_models import build_tiny_lm
    from transformers import AutoModelForCausalLM

    from harness.backends.hf import HFBackend
    from harness.commands.runner import Schedule, phase_hooks
    from harness.plan import LocalModel
    from harness.schedule import Phase

    path = build_tiny_lm(tmp_path / "m")
    real = AutoModelForCausalLM.from_pretrained.__func__
    seen: list[dict] = []
    spill: list[bool] = [False]

    def fake_from_pretrained(cls, source, **kwargs):
        seen.append(kwargs)
        model = real(cls, source, dtype=torch.float32)  # on the CPU: the GPUs are fakes
        model.hf_device_map = {"model": 0, "lm_head": "disk" if spill[0] else 1}
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(fake_from_pretrained))
    gpus(2)
    backend = HFBackend(str(path))
    key = f"hf:{path}"

    class Pool:
        class Wrapped:
            resident = False

        def __init__(self) -> None:
            self.wrapped = self.Wrapped()
            self.wrapped.backend = backend

        def backend(self, k: str):
            assert k == key
            return self.wrapped

    sized = LocalModel(key, "hf", str(path), 1000, "bfloat16", 2.0, 2, 3.0)
    schedule = Schedule([Phase(frozenset({key}), (frozenset({key}),), frozenset())], {}, {key: sized})
    from harness.backends.gate import Engines

    before, _ = phase_hooks(schedule, Pool(), start=True, engines=Engines(read_free=dict))
    asyncio.run(before(0))
    assert backend.resident and backend.max_memory == {0: 3 * GIB, 1: 3 * GIB}
    assert seen[-1]["device_map"] == "balanced" and seen[-1]["max_memory"] == {0: 3 * GIB, 1: 3 * GIB}
    assert seen[-1]["dtype"] == torch.bfloat16

    spill[0] = True
    again = HFBackend(str(path))
    again.max_memory = even_max_memory(2, 3.0)
    with pytest.raises(BackendUnavailableError, match="does not fit its GPUs: of its 2 placed modules, 1 to disk"):
        again.load()
