"""`harness bench verify` on a scripted verifier: counts, agreement and the printed ratios."""

import asyncio

import pytest
from judge_fakes import FakeJudge

from harness.commands import bench_verify
from harness.errors import ConfigError


def test_modes_counted_and_compared(monkeypatch: pytest.MonkeyPatch):
    prompt, responses, rubric = bench_verify.load_example(3, 2)
    # Truth: response 0 meets every criterion, response 1 none.
    judge = FakeJudge(
        truth={(responses[0], c): True for c in rubric.criteria},
        hook=lambda r: "yes" if "[Response]" not in r.messages[0].content else None,  # the warm-up request
    )
    monkeypatch.setattr("harness.backends.load_backend", lambda spec, options: judge)
    results, speeds = asyncio.run(bench_verify.run_bench_verify("fake", items=3, responses=2))
    assert speeds == []  # no throughput asked for
    by_mode = {r.mode: r for r in results}
    assert [r.mode for r in results] == ["per_item", "batched", "logprob"]
    assert by_mode["per_item"].calls == 6 and by_mode["batched"].calls == 2 and by_mode["logprob"].calls == 2
    assert all(r.agreement == 1.0 and r.compared == 6 and r.failed_cells == 0 for r in results)
    assert by_mode["batched"].prompt_tokens == 20 and by_mode["batched"].completion_tokens == 10
    text = bench_verify.format_bench_verify(results, spec="fake", items=3, responses=2)
    assert "per_item/batched: calls 3.0x" in text and "per_item/logprob: calls 3.0x" in text


def test_example_size_is_checked():
    with pytest.raises(ConfigError, match="--items must be in 1..10"):
        bench_verify.load_example(11, 2)
    with pytest.raises(ConfigError, match="--responses must be in 1..6"):
        bench_verify.load_example(2, 7)


@pytest.mark.slow
def test_smollm2_answer_sheet_and_logprob_modes_need_a_quarter_of_the_calls():
    results, speeds = asyncio.run(
        bench_verify.run_bench_verify(
            "smollm2-135m", items=6, responses=4, throughput={"prompts": 4, "max_tokens": 16}
        )
    )
    [speed] = speeds  # hf alone: no second backend to compare with
    assert speed.requests == 4 and speed.completion_tokens == 4 * 16 and speed.tokens_per_s > 0
    per_item, batched, logprob = results
    assert per_item.calls >= 24
    # The prefilled sheet is written whole on the first ask (no re-ask), and logprob needs no generation.
    assert batched.calls == logprob.calls == 4
    assert per_item.calls / batched.calls >= 4 and per_item.calls / logprob.calls >= 4
    assert batched.failed_cells == 0 and logprob.failed_cells == 0
    assert logprob.completion_tokens == 0 and logprob.prompt_tokens < per_item.prompt_tokens
    assert logprob.agreement is not None and batched.agreement is not None
    print(bench_verify.format_bench_verify(results, spec="smollm2-135m", items=6, responses=4))


def test_throughput_compares_a_vllm_model_with_hf_on_the_same_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert bench_verify.throughput_specs(f"vllm:{tmp_path}") == [f"vllm:{tmp_path}", f"hf:{tmp_path}"]
    assert bench_verify.throughput_specs(f"hf:{tmp_path}") == [f"hf:{tmp_path}"]
    results = [bench_verify.Throughput("vllm:m", 8, 512, 4.0), bench_verify.Throughput("hf:m", 8, 512, 8.0)]
    text = bench_verify.format_throughput(results, prompts=8, max_tokens=64)
    assert "vllm:m    2.00 requests/s    128.0 tokens/s" in text and "hf:m      1.00 requests/s" in text
    assert text.endswith("vllm/hf: 2.00x tokens/s")
