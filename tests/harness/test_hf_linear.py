"""The `hf` backend's few-row linear layers (`harness.backends.hf_linear`): the same products as `nn.Linear` for
every number of rows, gradients included, and only float32 CPU layers converted, their parameters untouched."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from harness.backends.hf_linear import MAX_ROWS, FewRowLinear, few_row_linears  # noqa: E402


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1,), (1, 1), (2, 1), (3, 1), (1, 4), (2, 3), (8,), (9,), (4, 5)])
def test_few_rows_give_what_linear_gives(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    plain = torch.nn.Linear(48, 80, bias=bias)
    few = torch.nn.Linear(48, 80, bias=bias)
    few.load_state_dict(plain.state_dict())
    assert few_row_linears(few) == 1 and type(few) is FewRowLinear
    x = torch.randn(*shape, 48, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    want, got = plain(x), few(x2)
    assert got.shape == want.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(few.weight.grad, plain.weight.grad, rtol=1e-4, atol=1e-5)


def test_the_transposed_product_is_taken_up_to_max_rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which path a call takes: the transposed product up to MAX_ROWS rows, `F.linear` past them (prefill)."""
    import harness.backends.hf_linear as module

    seen: list[int] = []
    real = module.F.linear
    monkeypatch.setattr(module.F, "linear", lambda x, w, b=None: seen.append(x.numel() // x.shape[-1]) or real(x, w, b))
    layer = torch.nn.Linear(8, 8)
    few_row_linears(layer)
    for rows in range(1, MAX_ROWS + 3):
        layer(torch.randn(rows, 8))
    assert seen == [MAX_ROWS + 1, MAX_ROWS + 2]


def test_only_float32_cpu_linears_change_and_parameters_stay_shared() -> None:
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(32, 16)
            self.proj = torch.nn.Linear(16, 16)
            self.bf16 = torch.nn.Linear(16, 16).to(torch.bfloat16)
            self.head = torch.nn.Linear(16, 32, bias=False)
            self.head.weight = self.embed.weight  # tied, as causal LMs tie their head to the embeddings

    model = Model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert few_row_linears(model) == 2
    assert type(model.proj) is FewRowLinear and type(model.head) is FewRowLinear
    assert type(model.bf16) is torch.nn.Linear
    assert model.head.weight is model.embed.weight
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert few_row_linears(model) == 0  # converted once


@pytest.mark.parametrize(("dtype", "converted"), [("float32", True), ("bfloat16", False)])
def test_the_hf_backend_loads_float32_models_with_the_few_row_path(tmp_path, dtype: str, converted: bool) -> None:
    import asyncio

    from tiny_models import build_tiny_lm

    from harness.backends.base import BackendOptions
    from harness.backends.hf import HFBackend

    backend = HFBackend(str(build_tiny_lm(tmp_path / "model")), BackendOptions(dtype=dtype))
    try:
        backend.load()
        linears = [m for m in backend._lm.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all((type(m) is FewRowLinear) == converted for m in linears)
    finally:
        asyncio.run(backend.close())
