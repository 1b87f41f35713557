"""lm-evaluation-harness through our backends: `HarnessLM` is an lm-eval `LM`, every call through the call cache.

From Python, any backend spec (`smollm2-135m`, `hf:DIR`, `vllm:Qwen/Qwen3-8B`, `openai:MODEL` with a base URL)
runs lm-eval's tasks with lm-eval's own metrics:

    import lm_eval
    from harness.lmeval import HarnessLM

    lm = HarnessLM("hf:checkpoints/dr-policy-8b")
    out = lm_eval.simple_evaluate(model=lm, tasks=["gsm8k"], apply_chat_template=True)
    lm.close()

and `harness lm-eval` does the same into a run directory (`run_lm_eval`). lm-eval's CLI finds no third-party
models, so it is left alone.

How requests map (lm-eval 0.4.x):

- `generate_until(context, gen_kwargs)`: one `GenerateRequest`. The context is a chat when lm-eval applied the
  chat template (`apply_chat_template` returns lm-eval's own `JsonChatStr`, as its chat-API models do: the
  history as JSON; a final assistant turn, lm-eval's `gen_prefix`, becomes the assistant prefill), else the text
  as one user turn (our backends all speak chat). `until` -> stop strings; `max_gen_toks` -> max tokens (256 when
  absent, lm-eval's default); `do_sample` false or absent -> greedy, else `temperature` (1.0 when absent) and
  `top_p`. Other keys are not ours to honour: each is warned about once and listed in `ignored_gen_kwargs`.
  Sampled requests get seeds derived from (seed, task, doc id, request index, copy), so lm-eval's repeats of one
  request differ from one another and a rerun draws the same samples (and hits the cache).
- `loglikelihood(context, continuation)`: one `LoglikelihoodRequest` (raw text, or the chat when the template was
  applied); the `hf` and `vllm` backends compute it as lm-eval's `hf` and `vllm` models do, `openai` from a vLLM
  server's prompt logprobs (its tokenizer splitting the text the same way).
- `loglikelihood_rolling(text)`: a loglikelihood of the whole text after an empty context (lm-eval's rolling
  windows collapse to one window when the text fits the model's context; a longer text fails, it is not cut).

A request the backend answers with a failure stops the evaluation with an error naming the task, the document
and the reason (`LMEvalError`); everything answered before it is in the call cache, so a rerun resumes for free.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import threading
import traceback
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from harness.backends.base import (
    BaseBackend,
    BackendOptions,
    GenerateRequest,
    LoglikelihoodRequest,
    Message,
    SamplingParams,
)
from harness.errors import ConfigError, HarnessError
from harness.seeds import derive_seed

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_MAX_GEN_TOKS = 256
"""lm-eval's `max_gen_toks` when a task sets none."""
_GEN_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature", "top_p"}

try:
    from lm_eval.api.model import LM as _LMBase
except ImportError:  # lm-eval is optional: the module imports, `HarnessLM` refuses to start without it
    _LMBase = object  # type: ignore[assignment,misc]


class LMEvalError(HarnessError):
    """A request lm-eval made could not be answered (the backend's failure, with the task and document)."""

    exit_code = 1


def _require_lm_eval() -> Any:
    try:
        import lm_eval
    except ImportError:
        raise ConfigError('lm-evaluation-harness is not installed: pip install -e ".[lmeval]"') from None
    return lm_eval


class HarnessLM(_LMBase):  # type: ignore[misc,valid-type]
    """Our backend as an lm-evaluation-harness `LM` (see the module docstring).

    Args:
        model: A model spec (built with `options`, wrapped in the call cache) or a backend already built (a
            `CachedBackend` keeps its cache; another backend is used as it is).
        options: Backend options for a spec (base URL, concurrency, batch size, dtype, ...).
        cache: The call cache for a spec (default: the user's; None with `no_cache`).
        no_cache: Bypass the call cache.
        seed: Seeds of sampled requests derive from it.

    Raises:
        ConfigError: lm-eval is not installed, or the spec is not valid.
    """

    def __init__(self, model: str | BaseBackend, *, options: BackendOptions | None = None, cache: Any = None,
                 no_cache: bool = False, seed: int = 0) -> None:
        _require_lm_eval()
        super().__init__()
        from harness.pool import BackendPool

        if isinstance(model, str):
            if cache is None and not no_cache:
                from harness.cache import CallCache

                cache = CallCache()
            self._pool: BackendPool | None = BackendPool(options=options, cache=None if no_cache else cache)
            self.backend: Any = self._pool.get(model)
            self._pool.preflight()
            self.spec = model
        else:
            self._pool, self.backend, self.spec = None, model, f"{model.kind}:{model.model}"
        self.seed = seed
        self.ignored_gen_kwargs: set[str] = set()
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests lm-eval made, per request type."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="harness-lm-eval", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------------------------- lm-eval API

    @property
    def tokenizer_name(self) -> str:
        """What lm-eval fingerprints its request cache with when the chat template is applied."""
        return self.spec.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str:
        return ""  # the backend applies its own template (or the server does)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> Any:
        """The history as lm-eval's `JsonChatStr` (JSON), turned back into messages for each request."""
        from lm_eval.models.api_models import JsonChatStr

        return JsonChatStr(json.dumps(chat_history, ensure_ascii=False))

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        copies: collections.Counter[tuple] = collections.Counter()
        built = []
        for inst in requests:
            context, gen_kwargs = inst.args[0], dict(inst.args[1] if len(inst.args) > 1 else {})
            where = (inst.task_name, inst.doc_id, inst.idx)
            copy = copies[where]
            copies[where] += 1
            messages, prefix = _chat(context)
            built.append(GenerateRequest(messages, self._params(gen_kwargs, where, copy), assistant_prefix=prefix))
        self.requests["generate_until"] += len(requests)
        completions = self._call(self.backend.generate(built))
        self._raise_failures("generate_until", requests, completions)
        return [c.texts[0] for c in completions]

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        built = []
        for inst in requests:
            context, continuation = inst.args[0], inst.args[1]
            built.append(_loglikelihood_request(context, continuation))
        self.requests["loglikelihood"] += len(requests)
        results = self._call(self.backend.loglikelihood(built))
        self._raise_failures("loglikelihood", requests, results)
        return [(r.logprob, bool(r.greedy)) for r in results]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        built = [LoglikelihoodRequest(inst.args[0]) for inst in requests]
        self.requests["loglikelihood_rolling"] += len(requests)
        results = self._call(self.backend.loglikelihood(built))
        self._raise_failures("loglikelihood_rolling", requests, results)
        return [r.logprob for r in results]

    # ---------------------------------------------------------------------------------------------- internals

    def _params(self, gen_kwargs: Mapping[str, Any], where: tuple, copy: int) -> SamplingParams:
        until = gen_kwargs.get("until") or ()
        stops = (until,) if isinstance(until, str) else tuple(until)
        for key in sorted(set(gen_kwargs) - _GEN_KWARGS):
            if key not in self.ignored_gen_kwargs:
                log.warning("lm-eval generation setting %s=%r is not passed to the backend (it takes until, "
                            "max_gen_toks, do_sample, temperature, top_p)", key, gen_kwargs[key])
                self.ignored_gen_kwargs.add(key)
        sample = bool(gen_kwargs.get("do_sample", False))
        temperature = float(gen_kwargs.get("temperature", 1.0)) if sample else 0.0
        return SamplingParams(
            temperature=temperature,
            top_p=float(gen_kwargs.get("top_p", 1.0)) if sample else 1.0,
            max_tokens=int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)),
            seed=derive_seed(self.seed, *where, copy) if temperature > 0 else None,
            stop=tuple(s for s in stops if s),
        )

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _raise_failures(self, kind: str, requests: Sequence[Any], results: Sequence[Any]) -> None:
        failed = [(inst, r.error) for inst, r in zip(requests, results) if r.error is not None]
        if not failed:
            return
        inst, error = failed[0]
        raise LMEvalError(
            f"{self.spec}: {len(failed)} of {len(requests)} {kind} requests failed; the first, task "
            f"{inst.task_name!r} document {inst.doc_id}: {error.category.value}: {error.message} (the answered "
            "requests are in the call cache: a rerun asks only the rest)"
        )

    @property
    def calls(self) -> int:
        """Backend calls the cache could not answer."""
        return getattr(self.backend, "calls", 0)

    @property
    def hits(self) -> int:
        return getattr(self.backend, "hits", 0)

    def recording_calls(self, path: Path | None) -> Any:
        """Record the calls made within the block in `path` (a run's calls.sqlite), as `harness run` does; nothing
        for a backend built elsewhere or without a call cache."""
        if self._pool is None or path is None:
            return contextlib.nullcontext()
        return self._pool.recording_calls(path)

    def close(self) -> None:
        """Close the backends built here and stop the event loop."""
        if self._loop.is_closed():
            return
        if self._pool is not None:
            self._call(self._pool.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def _chat(context: Any) -> tuple[tuple[Message, ...], str]:
    """(messages, assistant prefix) of a generation context: lm-eval's JSON chat, or a text as one user turn."""
    from lm_eval.models.api_models import JsonChatStr

    if isinstance(context, JsonChatStr):
        turns = json.loads(context.prompt)
        prefix = ""
        if turns and turns[-1]["role"] == "assistant":
            prefix = turns.pop()["content"]
        return tuple(Message(t["role"], t["content"]) for t in turns), prefix
    return (Message("user", str(context)),), ""


def _loglikelihood_request(context: Any, continuation: str) -> LoglikelihoodRequest:
    from lm_eval.models.api_models import JsonChatStr

    if isinstance(context, JsonChatStr):
        messages, prefix = _chat(context)
        return LoglikelihoodRequest(continuation, prefix, messages)
    return LoglikelihoodRequest(continuation, str(context))


# ---------------------------------------------------------------------------------------------------- the verb


def run_lm_eval(model: str, tasks: Sequence[str], out: Path, *, include_path: Path | None = None,
                limit: int | None = None, num_fewshot: int | None = None, chat_template: bool = True,
                seed: int = 0, options: BackendOptions | None = None, no_cache: bool = False,
                replay: Path | None = None, overwrite: bool = False, wait: bool = False,
                bootstrap_iters: int = 1000) -> dict[str, Any]:
    """Run lm-eval `tasks` on `model` into the run directory `out`; returns lm-eval's results (without samples).

    Writes `results.json` (lm-eval's results, n-shot, versions, configs), `table.md` (lm-eval's table),
    `records.jsonl` (one record per task and document: lm-eval's logged sample), `manifest.json` (settings,
    identity, calls) under the run store's lock and binding rule: a rerun with the same settings resumes (the call
    cache answers what was asked), with others it is refused unless `overwrite`; while another process writes `out`
    it is refused, or waited for with `wait`.

    Raises:
        ConfigError: lm-eval missing, an unknown task (with the include path's YAML files lm-eval could not
            read), a task lm-eval could not build (with its YAML), a missing include path, other settings in `out`.
        LMEvalError: a request the backend could not answer.
    """
    lm_eval = _require_lm_eval()
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable, make_table

    from harness.records import LMEvalSampleRecord
    from harness.runstore import Output, OutputPaths, package_versions, write_json_atomic, write_text_atomic

    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(f"--include-path {include_path}: not a directory")
    if not tasks:
        raise ConfigError("--tasks names no task")
    manager = _task_manager(TaskManager, include_path, tasks)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(_unknown_tasks(unknown, include_path))
    built = _build_tasks(manager, tasks)
    if replay is not None and no_cache:
        raise ConfigError("--replay and --no-cache exclude each other: a replay answers every call from its file")
    cache = None
    if replay is not None:
        from harness.cache import CallCache

        cache = CallCache(replay, read_only=True)
    lm = HarnessLM(model, options=options, cache=cache, no_cache=no_cache, seed=seed)
    settings = {"model": model, "identity": lm.backend.identity(), "tasks": list(tasks), "limit": limit,
                "num_fewshot": num_fewshot, "chat_template": chat_template, "seed": seed,
                "include_path": _fingerprint(include_path), "lm_eval": package_versions(["lm_eval"])["lm_eval"]}
    paths = OutputPaths.run_dir(out)
    output = Output(paths, LMEvalSampleRecord, command="lm-eval", settings=settings,
                    config={"backend": _options_json(options), "no_cache": no_cache,
                            **({"replay": str(replay)} if replay is not None else {}),
                            "bootstrap_iters": bootstrap_iters}, overwrite=overwrite, wait=wait)
    try:
        with output, lm.recording_calls(paths.calls):
            results = lm_eval.simple_evaluate(
                model=lm, tasks=built, num_fewshot=num_fewshot, limit=limit, task_manager=manager,
                apply_chat_template=chat_template, log_samples=True, bootstrap_iters=bootstrap_iters,
                random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
            )
            samples = results.pop("samples", {}) or {}
            safe = json.loads(json.dumps(results, default=handle_non_serializable))
            records = [LMEvalSampleRecord(task, int(s["doc_id"]), json.loads(json.dumps(
                s, default=handle_non_serializable))) for task, rows in samples.items() for s in rows]
            output.log.append(records)
            write_json_atomic(out / "results.json", safe)
            write_text_atomic(out / "table.md", make_table(results) + "\n")
            output.summary = {"records": len(records), "calls": lm.calls, "cache_hits": lm.hits,
                              "requests": dict(lm.requests), "ignored_gen_kwargs": sorted(lm.ignored_gen_kwargs)}
    finally:
        lm.close()
    return safe


def _task_manager(task_manager: Any, include_path: Path | None, tasks: Sequence[str]) -> Any:
    """lm-eval's task index: of `include_path` alone when it holds every task asked (indexing lm-eval's own
    ~15,000 task configs takes seconds), else of both."""
    if include_path is not None:
        local = task_manager(include_path=str(include_path), include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    return task_manager(include_path=str(include_path) if include_path else None)


def _unknown_tasks(unknown: Sequence[str], include_path: Path | None) -> str:
    """The message for tasks missing from lm-eval's index, with each YAML file under `include_path` it could
    not read: the index skips such files without a word, and a broken file is the likeliest reason."""
    if include_path is None:
        return f"unknown lm-eval task(s) {', '.join(unknown)} (add --include-path DIR for your own YAML)"
    message = f"unknown lm-eval task(s) {', '.join(unknown)} (nor in {include_path})"
    unread = _unreadable_yaml(Path(include_path))
    if unread:
        message += f"; lm-eval could not read {len(unread)} file(s) there: " + "; ".join(unread)
    return message


def _unreadable_yaml(folder: Path) -> list[str]:
    """'FILE: why' for each YAML file under `folder` that lm-eval's task index skips because it cannot load it.

    The files and the loader are lm-eval's own (the index's file walk, its YAML loader with includes), so what is
    reported is what the index skipped; a file that loads but is no task (a template for `include`) is not.
    """
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    unread = []
    for path in TaskIndex._iter_yaml_files(folder):
        try:
            load_yaml(path, resolve_func=False)
        except Exception as err:  # the index skips a file on any error, so every one is reported
            unread.append(f"{path}: {_load_problem(err, path)}")
    return unread


def _load_problem(err: Exception, path: Path | None) -> str:
    """One line for why lm-eval could not load the YAML file `path`: the YAML problem at its line and column
    (1-based), the first byte that is not UTF-8 (0-based offset), or the error's own message. A problem in another
    file (one `path` includes) names that file."""
    import yaml

    mark = getattr(err, "problem_mark", None)
    if isinstance(err, yaml.MarkedYAMLError) and mark is not None:
        problem = f"{err.context}: {err.problem}" if err.context else err.problem
        where = f"{_elsewhere(mark.name, path)} at line {mark.line + 1}, column {mark.column + 1}"
        return f"YAML error{where}: {problem}"
    if isinstance(err, yaml.reader.ReaderError):
        # libyaml's position points past the bad sequence; decoding the bytes names its first byte
        try:
            Path(err.name).read_bytes().decode("utf-8")
        except UnicodeDecodeError as bad:
            return f"not UTF-8{_elsewhere(err.name, path)} at byte {bad.start} (0x{bad.object[bad.start]:02x})"
        except OSError:
            pass
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _elsewhere(name: str, path: Path | None) -> str:
    """' in NAME' when the file at fault is not `path` itself (lm-eval's loader names files by resolved path)."""
    return "" if path is not None and Path(name) == Path(path).resolve() else f" in {name}"


def _build_tasks(manager: Any, tasks: Sequence[str]) -> list[Any]:
    """lm-eval's Task and Group objects for `tasks`, built before any model loads or run directory is written.

    lm-eval reads each task's YAML in full (functions, dataset) only when it builds the task, so a bad value or a
    missing data file surfaces here, as one ConfigError naming the YAML file and the task. The objects go to
    `simple_evaluate` as they are, which takes built tasks in place of names (each task is built once).

    Raises:
        ConfigError: lm-eval could not build a task (any exception while it builds one).
    """
    built: list[Any] = []
    for name in tasks:
        try:
            loaded = manager.load([name])
        except Exception as err:
            raise _build_error(manager, name, err) from err
        group = loaded.get("groups", {}).get(name)
        built.extend([group] if group is not None else loaded["tasks"].values())
    return built


def _build_error(manager: Any, name: str, err: Exception) -> ConfigError:
    """The error for task `name` that lm-eval failed to build, naming the YAML file of the task at fault."""
    from lm_eval.tasks._index import Entry

    # lm-eval's exception does not say which file it was building; the innermost index entry on the stack does
    # (in a group or a tag, the member at fault)
    entries = [frame.f_locals.get("entry") for frame, _ in traceback.walk_tb(err.__traceback__)]
    entry = next((e for e in reversed(entries) if isinstance(e, Entry)), manager.task_index[name])
    task = entry.name if entry.name == name else f"{entry.name} (in {name})"
    where = f"{entry.yaml_path}: " if entry.yaml_path else ""
    problem = _load_problem(err, entry.yaml_path)
    return ConfigError(f"{where}lm-eval could not build task {task}: {problem}")


def _fingerprint(folder: Path | None) -> dict[str, str] | None:
    """sha256 of every file under an include path (its task YAMLs and data), so other tasks are other settings."""
    if folder is None:
        return None
    import hashlib

    root = Path(folder)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _options_json(options: BackendOptions | None) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(options) if options is not None else {}



def summary_lines(out: Path) -> list[str]:
    """What `harness lm-eval` prints of a finished run: lm-eval's table, the counts, what was not passed on."""
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    summary = json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("summary", {})
    lines = [(out / "table.md").read_text(encoding="utf-8").rstrip(),
             f"{out}: {len(results.get('results', {}))} task(s), {summary.get('records', 0)} documents; "
             f"backend calls: {summary.get('calls', 0)}, cache hits: {summary.get('cache_hits', 0)}"]
    if summary.get("ignored_gen_kwargs"):
        lines.append("generation settings not passed to the backend: " + ", ".join(summary["ignored_gen_kwargs"]))
    return lines
