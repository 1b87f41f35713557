"""Prompt sets for `harness generate`: a JSONL file of chats, or a registered benchmark's prompts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from harness.backends.base import Message
from harness.errors import ConfigError
from harness.generation import PromptRecord
from harness.jsonl import read_jsonl

_ROLES = {"system", "user", "assistant"}


def _messages_from(obj: dict, where: str) -> tuple[Message, ...]:
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ConfigError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
        out = []
        for i, m in enumerate(msgs):
            if (
                not isinstance(m, dict)
                or m.get("role") not in _ROLES
                or not isinstance(m.get("content"), str)
            ):
                raise ConfigError(
                    f"{where}: messages[{i}] must be {{'role': system|user|assistant, 'content': str}}"
                )
            out.append(Message(m["role"], m["content"]))
        return tuple(out)
    for field in ("prompt", "instruction"):
        if field in obj:
            text = obj[field]
            if not isinstance(text, str) or not text.strip():
                raise ConfigError(f"{where}: {field!r} must be a non-empty string")
            system = obj.get("system")
            head = (Message("system", system),) if isinstance(system, str) and system else ()
            return head + (Message("user", text),)
    raise ConfigError(
        f"{where}: expected a 'prompt', 'instruction' or 'messages' field, got keys {sorted(obj)}"
    )


def iter_jsonl_records(path: Path, *, what: str) -> Iterator[tuple[str, str, dict]]:
    """Yield `(where, id, object)` for each non-blank line of an input JSONL file with unique scalar ids.

    `where` is `FILE:LINE` for error messages; `what` names the file's role in the not-found message.

    Raises:
        ConfigError: for a missing or empty file, or naming the file and line of a malformed or duplicate record.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} file not found: {path}")
    seen: set[str] = set()
    for where, obj in read_jsonl(path):
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if "id" not in obj or not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
            raise ConfigError(f"{where}: missing or non-scalar 'id' (a string or integer is required)")
        rid = str(obj["id"])
        if rid in seen:
            raise ConfigError(f"{where}: duplicate id {rid!r}")
        seen.add(rid)
        yield where, rid, obj
    if not seen:
        raise ConfigError(f"{path}: no records in file")


def read_prompts_file(path: Path) -> list[PromptRecord]:
    """Read `{"id", "prompt" | "instruction" | "messages", ["system"]}` lines.

    Raises:
        ConfigError: naming the file and line of the first malformed or duplicate record.
    """
    return [
        PromptRecord(rid, _messages_from(obj, where))
        for where, rid, obj in iter_jsonl_records(path, what="prompts")
    ]


def benchmark_prompts(
    name: str, *, data_dir: Path | None, limit: int | None, options: dict | None = None
) -> list[PromptRecord]:
    """The prompts of a registered benchmark (its policy-evaluation inputs); `options` go to its loader
    (`writingbench`: `subset`; `arena_hard_v2`: `missing_baseline`).

    Raises:
        ConfigError: for an evaluator benchmark, or an option its loader does not take (listing those it does).
    """
    from harness.registry import lookup

    benchmark = lookup("benchmark", name)
    if benchmark.kind != "policy":
        raise ConfigError(
            f"benchmark {name!r} is a {benchmark.kind} evaluator benchmark; --benchmark takes a policy benchmark's"
            " prompts (or pass --prompts FILE)"
        )
    from harness.commands.runner import load_options

    options = dict(options or {})
    unknown = sorted(set(options) - set(load_options(benchmark)))
    if unknown:
        valid = ", ".join(load_options(benchmark)) or "none"
        raise ConfigError(f"benchmark {name!r}: unknown option(s) {', '.join(unknown)}; valid: {valid}")
    items = benchmark.load(data_dir=data_dir, limit=limit, **options)
    return [PromptRecord(item.id, item.messages) for item in items]


def generate_samples(model: str, out: Path, *, prompts: Path | None, benchmark: str | None, data_dir: Path | None,
                     limit: int | None, bench_option: list[str] | None, sampling, backend, outputs):
    """`harness generate`: sample `model`'s answers to a prompt file or a benchmark's prompts into `out`; the
    loop's summary.

    Raises:
        ConfigError: for both or neither of a prompt file and a benchmark, an output that is the input, loader
            options without a benchmark.
    """
    from harness.commands.setup import as_dict, backend_options, bench_options, drive, same_file
    from harness.generation import GenerateConfig, run_generate
    from harness.pool import BackendPool

    if (prompts is None) == (benchmark is None):
        raise ConfigError("give exactly one of --prompts FILE or --benchmark NAME")
    if prompts is not None and same_file(prompts, out):
        raise ConfigError(f"--out {out} is the prompts file itself; choose another output file")
    if bench_option and benchmark is None:
        raise ConfigError("--bench-option goes with --benchmark")
    if prompts is not None:
        records = read_prompts_file(prompts)[:limit]
    else:
        options = bench_options([f"{benchmark}.{o}" for o in bench_option or ()], {}).get(benchmark)
        records = benchmark_prompts(benchmark, data_dir=data_dir, limit=limit, options=options)
    options = backend_options(backend)
    config = GenerateConfig(model=model, source=str(prompts or benchmark), n=sampling.n,
                            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
                            seed=sampling.seed, limit=limit, stop=tuple(sampling.stop or ()))
    pool = BackendPool(options=options, cache=outputs.call_cache())
    generator = pool.get(model)
    pool.preflight()
    return drive(pool, lambda: run_generate(
        generator, records, config, out, parallel=max(64, 4 * options.concurrency),
        runtime={"backend": as_dict(options), **outputs.recorded()},
        overwrite=outputs.overwrite, wait=outputs.wait, retry_failed=outputs.retry_failed,
    ))
