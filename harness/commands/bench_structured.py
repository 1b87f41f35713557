"""`harness bench structured`: the same outputs with and without their structured-output constraint.

On the shipped example (`harness/examples/verify_bench.json`: a prompt, its responses and a rubric), three tasks run
free and constrained, on one backend loaded once (the call cache is bypassed); on `hf` the constrained requests run
twice, one token a pass (`constrained`) and with jump-forward (`jump-forward`: the tokens the grammar forces fed in
one pass, `BackendOptions.jump_forward`), so the ratio is shown with and without it, with the share of tokens forced:

- `rubric`: the dynamic generator's request, `--rubrics` samples (temperature 0.7, derived seeds), parsed with
  `parse_rubric`; constrained by `judges.dynamic.rubric_constraint(--max-tokens)`;
- `per_item`: one Yes/No question per item x response, parsed with `parse_yes_no`;
- `batched`: one answer sheet per response, parsed with `parse_answer_sheet`.

Per task and output: requests, parse failures (no re-ask here: the raw rate), completion tokens, wall time and
decode throughput (completion tokens per second after the prompt: the wall time of the same requests with one new
token each is subtracted, since constrained answers are often shorter and the prompt would otherwise weigh more),
the constrained/free throughput ratio (requests run one at a time, so rows that end early do not wait in a batch),
and for the verifier tasks the agreement of the constrained verdicts with
the free ones, verdict by verdict, where both parsed. The conditions of a task run back to
back in the same process, so the ratios are measured in one run. Free first, so a warm-up advantage, if any, goes to
the constrained side's baseline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from harness.backends.base import (
    BackendOptions,
    GenerateRequest,
    Message,
    SamplingParams,
    assistant_text,
    user_chat,
)


@dataclass(frozen=True, slots=True)
class TaskResult:
    task: str
    output: str
    """`free`, `constrained`, or `jump-forward` (constrained, the forced tokens fed in one pass: `hf` only)."""
    requests: int
    parse_failures: int
    completion_tokens: int
    wall_s: float
    prefill_s: float
    """Wall time of the same requests with one new token each: the prompt's share, left out of `tokens_per_s`."""
    answers: tuple[object, ...]
    """Parsed answers (None where parsing failed), aligned across the conditions of a task."""
    forced_tokens: int = 0
    """Tokens the grammar forced (fed without a pass of their own; `jump-forward` only)."""

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: completion tokens per second of generation after the prompt."""
        decode = self.wall_s - self.prefill_s
        return self.completion_tokens / decode if decode > 0 else 0.0


def _requests(task: str, *, structured: bool, prompt: str, responses: list[str], rubric, rubrics: int,
              max_tokens: int) -> tuple[list[GenerateRequest], object]:
    from harness.seeds import derive_seed
    from judges.dynamic import dynamic_generator_prompt, presentation_order, rubric_constraint
    from judges.rubric import parse_rubric
    from judges.templates import render_template
    from judges.verify import (
        SHEET_PREFILL,
        VERDICT_CHOICE,
        sheet_prompt,
        parse_answer_sheet,
        parse_yes_no,
        sheet_params,
    )

    if task == "rubric":
        order = presentation_order(len(responses), 0)
        text = dynamic_generator_prompt(prompt, responses, order)
        constraint = rubric_constraint(max_tokens) if structured else None
        requests = [
            GenerateRequest((Message("user", text),), SamplingParams(
                temperature=0.7, max_tokens=max_tokens, seed=derive_seed(s, "rubric"), constraint=constraint))
            for s in range(rubrics)
        ]
        return requests, lambda t: [(i.criterion, i.weight) for i in parse_rubric(t).items]
    if task == "per_item":
        params = SamplingParams(max_tokens=16, constraint=VERDICT_CHOICE if structured else None)
        requests = [
            GenerateRequest(user_chat(render_template("verify_item", prompt=prompt, response=r, criterion=c)), params)
            for r in responses for c in rubric.criteria
        ]
        return requests, parse_yes_no
    params = sheet_params(len(rubric), 16, structured=structured)
    requests = [GenerateRequest((Message("user", sheet_prompt(prompt, r, rubric)),), params, SHEET_PREFILL)
                for r in responses]
    return requests, lambda t: tuple(parse_answer_sheet(t, len(rubric)))


async def run_bench_structured(
    spec: str, *, rubrics: int = 4, max_tokens: int = 256, items: int = 6, responses: int = 4,
    options: BackendOptions | None = None,
) -> list[TaskResult]:
    from harness.backends import load_backend
    from harness.commands.bench_verify import load_example

    prompt, texts, rubric = load_example(items, responses)
    backend = load_backend(spec, options or BackendOptions())
    results = []
    try:
        await backend.probe()
        await backend.generate([GenerateRequest(user_chat("Say yes."), SamplingParams(max_tokens=2))])  # warm-up
        counts = getattr(backend, "decode_counts", None)  # hf: its decode loop's passes and forced tokens
        outputs = ["free", "constrained"] + (["jump-forward"] if counts is not None else [])
        for task in ("rubric", "per_item", "batched"):
            for output in outputs:
                structured = output != "free"
                if counts is not None:  # the loaded model's setting, switched between conditions
                    backend.options = replace(backend.options, jump_forward=output == "jump-forward")
                requests, parse = _requests(task, structured=structured, prompt=prompt, responses=texts,
                                            rubric=rubric, rubrics=rubrics, max_tokens=max_tokens)
                # One request at a time: a batch would also time the rows that finished early waiting for the
                # rest, and constrained answers end at different lengths.
                prefill = wall = 0.0
                out = []
                before = dict(counts or {})
                for r in requests:
                    start = time.perf_counter()
                    await backend.generate([GenerateRequest(r.messages, SamplingParams(max_tokens=1), r.assistant_prefix)])
                    prefill += time.perf_counter() - start
                    start = time.perf_counter()
                    out += await backend.generate([r])
                    wall += time.perf_counter() - start
                delta = {k: v - before[k] for k, v in counts.items()} if counts is not None else {}
                answers = []
                for request, completion in zip(requests, out):
                    try:
                        answers.append(parse(assistant_text(request.assistant_prefix, completion)))
                    except (ValueError, IndexError):
                        answers.append(None)
                results.append(TaskResult(
                    task, output, len(requests), sum(a is None for a in answers),
                    sum(c.usage.completion_tokens for c in out), wall, prefill, tuple(answers),
                    forced_tokens=delta.get("forced_tokens", 0),
                ))
    finally:
        await backend.close()
    return results


def format_bench_structured(results: list[TaskResult], *, spec: str) -> str:
    lines = [
        f"model {spec}: each task free, then under its constraint (call cache bypassed)",
        f"{'task':<10} {'output':<13} {'requests':>8} {'parse fail':>10} {'compl tok':>9} {'forced':>7} "
        f"{'wall s':>8} {'prompt s':>8} {'tok/s':>7}",
    ]
    for r in results:
        lines.append(f"{r.task:<10} {r.output:<13} {r.requests:>8} {r.parse_failures:>10} {r.completion_tokens:>9} "
                     f"{r.forced_tokens:>7} {r.wall_s:>8.2f} {r.prefill_s:>8.2f} {r.tokens_per_s:>7.1f}")
    tasks: dict[str, dict[str, TaskResult]] = {}
    for r in results:
        tasks.setdefault(r.task, {})[r.output] = r
    for task, by in tasks.items():
        free, constrained = by["free"], by["constrained"]
        line = (f"{task}: parse failures {free.parse_failures}/{free.requests} free, "
                f"{constrained.parse_failures}/{constrained.requests} constrained; "
                f"decode throughput constrained/free {_ratio(constrained, free):.2f}x")
        jumped = by.get("jump-forward")
        if jumped is not None:
            share = jumped.forced_tokens / jumped.completion_tokens if jumped.completion_tokens else 0.0
            line += (f", {_ratio(jumped, free):.2f}x with jump-forward ({share:.0%} of its tokens forced, "
                     f"{jumped.parse_failures}/{jumped.requests} parse failures)")
        if task != "rubric":
            pairs = [(a, b) for a, b in zip(free.answers, constrained.answers) if a is not None and b is not None]
            if task == "batched":  # sheets: compare verdict by verdict
                pairs = [(x, y) for a, b in pairs for x, y in zip(a, b)]
            agree = sum(a == b for a, b in pairs) / len(pairs) if pairs else float("nan")
            line += f"; verdicts agree with free {agree:.2f} ({len(pairs)} parsed in both)"
        lines.append(line)
    return "\n".join(lines)


def _ratio(a: TaskResult, b: TaskResult) -> float:
    return a.tokens_per_s / b.tokens_per_s if b.tokens_per_s else float("nan")


def bench_structured_sync(spec: str, **kwargs) -> str:
    return format_bench_structured(asyncio.run(run_bench_structured(spec, **kwargs)), spec=spec)
