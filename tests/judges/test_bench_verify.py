"""`harness bench verify` on a scripted verifier: counts, agreement and the printed ratios."""

import asyncio

import pytest
from judge_fakes import FakeJudge

from harness.commands import bench_verify
from harness.errors import ConfigError


def test_modes_counted_and_compared(monkeypatch: pytest.MonkeyPatch):
    prompt, responses, rubric = bench_verify.load_example(3, 2)
    # Truth: response 0 meets every criterion, response 1 none.
    warm_up = "[Response]"  # the warm-up requests are the only ones without a response in them
    judge = FakeJudge(
        truth={(responses[0], c): True for c in rubric.criteria},
        hook=lambda r: "yes" if warm_up not in r.messages[0].content else None,
        logprob_hook=lambda text: {"Yes": 0.0} if warm_up not in text else None,
    )
    monkeypatch.setattr("harness.backends.load_backend", lambda spec, options: judge)
    results, speeds, lacking = asyncio.run(bench_verify.run_bench_verify("fake", items=3, responses=2))
    assert lacking == {}
    assert speeds == []  # no throughput asked for
    assert [r.label for r in results] == [
        "per_item", "per_item (constrained)", "batched", "batched (constrained)", "logprob"]
    assert [r.calls for r in results] == [6, 6, 2, 2, 2]
    assert all(r.agreement == 1.0 and r.compared == 6 and r.failed_cells == 0 for r in results)
    assert all(r.reasks == r.parse_failures == 0 for r in results)
    batched = results[2]
    assert batched.prompt_tokens == 20 and batched.completion_tokens == 10
    text = bench_verify.format_bench_verify(results, spec="fake", items=3, responses=2)
    assert "per_item/batched: calls 3.0x" in text and "per_item/logprob: calls 3.0x" in text
    assert "batched: tokens/s constrained/free" in text and "parse failures 0 free, 0 constrained" in text
    assert "calls: backend requests" in text


def test_example_size_is_checked():
    with pytest.raises(ConfigError, match="--items must be in 1..10"):
        bench_verify.load_example(11, 2)
    with pytest.raises(ConfigError, match="--responses must be in 1..6"):
        bench_verify.load_example(2, 7)


@pytest.mark.slow
def test_smollm2_answer_sheet_and_logprob_modes_need_a_quarter_of_the_calls():
    results, speeds, _ = asyncio.run(
        bench_verify.run_bench_verify(
            "smollm2-135m", items=6, responses=4, throughput={"prompts": 4, "max_tokens": 16}
        )
    )
    [speed] = speeds  # hf alone: no second backend to compare with
    assert speed.requests == 4 and speed.completion_tokens == 4 * 16 and speed.tokens_per_s > 0
    per_item, constrained_item, batched, constrained_sheet, logprob = results
    assert per_item.calls >= 24 and constrained_item.calls == 24  # a constrained verdict always parses
    # The prefilled sheet is written whole on the first ask (no re-ask), and logprob needs no generation.
    assert batched.calls == constrained_sheet.calls == logprob.calls == 4
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
