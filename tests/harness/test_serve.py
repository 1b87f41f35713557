"""`harness serve`: the servers a run needs, started, waited for, written down and stopped, none left over.

vLLM is not needed: the tests run the real CLI through a driver script that points `harness.serve.server_argv`
at a stand-in server (written here) which takes vLLM's arguments, records them, its environment and its pid,
starts a child process in its group (as vLLM starts engine workers) and answers `GET /v1/models` through
`harness.loopback`. Extra arguments from the config's `serve:` steer it: `--gate FILE` (listen only once FILE
exists) and `--fail-after N` (once N stand-ins have recorded themselves, print 40 lines and exit 3). Every
wait is on a file or a process, never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from waits import wait_until

STANDIN = '''
import argparse, asyncio, json, os, subprocess, sys, time
from pathlib import Path
from harness.loopback import json_response, models_list, serve

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
parser.add_argument("--served-model-name")
parser.add_argument("--gate")
parser.add_argument("--fail-after", type=int)
args, _ = parser.parse_known_args()
records = Path(os.environ["STANDIN_DIR"])
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
record = {"pid": os.getpid(), "worker": worker.pid, "argv": sys.argv[1:], "served": args.served_model_name,
          "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "port": args.port}
(records / f"{args.port}.tmp").write_text(json.dumps(record))
(records / f"{args.port}.tmp").rename(records / f"{args.port}.json")


def wait(ready):
    while not ready():
        time.sleep(0.02)


if args.fail_after:
    wait(lambda: len(list(records.glob("*.json"))) >= args.fail_after)
    for i in range(1, 41):
        print(f"start-up line {i}")
    print("ValueError: the stand-in cannot start", flush=True)
    sys.exit(3)
if args.gate:
    wait(lambda: Path(args.gate).exists())


async def handle(request):
    if request.method == "GET" and request.path == "/v1/models":
        return json_response(models_list(args.served_model_name))
    return json_response({"error": {"message": "no route"}}, status=404)


async def main():
    await serve(handle, port=args.port)
    await asyncio.Event().wait()

asyncio.run(main())
'''

DRIVER = '''
import sys
from pathlib import Path

import harness.serve as serve

STANDIN = str(Path(__file__).with_name("standin.py"))
serve.server_argv = lambda launch: [sys.executable, STANDIN, *serve.server_args(launch)]

from harness.commands.cli import main

main()
'''


def _checkpoint(path: Path, arch: str) -> str:
    """A checkpoint folder as far as building a backend reads it: its config.json (nothing loads)."""
    path.mkdir(parents=True)
    config = {"architectures": [arch], "model_type": "llama", "num_labels": 1, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 256, "max_position_embeddings": 512}
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.fixture
def setup(tmp_path: Path) -> dict:
    """The stand-in and driver scripts, four checkpoints, a records folder, and `harness serve`'s env."""
    (tmp_path / "standin.py").write_text(STANDIN)
    (tmp_path / "driver.py").write_text(DRIVER)
    records = tmp_path / "records"
    records.mkdir()
    models = tmp_path / "models"
    root = str(Path(__file__).resolve().parents[2])
    # CUDA_VISIBLE_DEVICES empty: a CPU machine, on any machine.
    env = {**os.environ, "STANDIN_DIR": str(records), "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return {
        "dir": tmp_path,
        "records": records,
        "env": env,
        "gen": f"vllm:{_checkpoint(models / 'gen', 'LlamaForCausalLM')}",
        "ver": f"vllm:{_checkpoint(models / 'ver', 'LlamaForCausalLM')}",
        "rm": f"vllm:{_checkpoint(models / 'rm', 'LlamaForSequenceClassification')}",
        "token0": f"hf:{_checkpoint(models / 'token0', 'LlamaForCausalLM')}",
    }


def _config(setup: dict, serve: dict, *, rows: tuple[str, ...] = ("dr", "rm", "token0")) -> Path:
    every = {
        "dr": ("Qwen3-8B zero-shot", f"dynamic-rubric:generator={setup['gen']},verifier={setup['ver']}"),
        "rm": ("Skywork-27B", f"scalar-rm:model={setup['rm']}"),
        "token0": ("Nemotron-70B", f"scalar-rm:model={setup['token0']},head=lm-token0"),
    }
    chosen = dict(every[r] for r in rows)
    path = setup["dir"] / "run.yaml"
    path.write_text(yaml.safe_dump({"rows": chosen, "only_rows": list(chosen), "serve": serve}))
    return path


def _serve(setup: dict, config: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path, Path]:
    """`harness serve table1` in the background: (process, endpoints file, stdout file, stderr file)."""
    out = setup["dir"] / "endpoints.yaml"
    stdout, stderr = setup["dir"] / "serve.out", setup["dir"] / "serve.err"
    with stdout.open("w") as o, stderr.open("w") as e:
        argv = [sys.executable, str(setup["dir"] / "driver.py"), "serve", "table1", "--config", str(config),
                "--endpoints", str(out), *extra]
        proc = subprocess.Popen(argv, stdout=o, stderr=e, env=setup["env"])
    return proc, out, stdout, stderr


def _records(setup: dict) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(setup["records"].glob("*.json"))]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _assert_no_process_left(records: list[dict]) -> None:
    """Every stand-in and its worker no longer exists (a worker's zombie is read by init within a moment)."""
    pids = [r[k] for r in records for k in ("pid", "worker")]
    wait_until(f"processes {pids} to be gone", lambda: all(_gone(p) for p in pids))
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_endpoints_appear_once_every_server_answers_and_a_signal_stops_them(setup: dict, stop) -> None:
    from harness.backends.models import weights_fingerprint
    from harness.endpoints import read_endpoints

    gate = setup["dir"] / "gate"
    config = _config(setup, {setup["ver"]: {"replicas": 2}, setup["gen"]: {"args": ["--gate", str(gate)]}})
    proc, out, stdout, stderr = _serve(setup, config)
    try:
        # Three servers answer and are reported; the generator's waits for the gate: no endpoints file yet.
        wait_until("three servers to answer", lambda: stdout.read_text().count(" replica ") == 3, (proc, stderr))
        assert len(_records(setup)) == 4
        assert not out.exists()
        gate.touch()
        wait_until("the endpoints file", out.exists, (proc, stderr))
        data = yaml.safe_load(out.read_text())
        assert stdout.read_text().count(" replica ") == 4
        assert f"not served: {setup['token0']}" in stdout.read_text()  # read with head=lm-token0: stays local

        assert set(data["models"]) == {setup["gen"], setup["ver"], setup["rm"]}
        for spec in data["models"]:
            entry = data["models"][spec]
            assert entry["served"] == spec.removeprefix("vllm:")
            weights = weights_fingerprint(spec.removeprefix("vllm:"))
            assert entry["identity"] == {"weights": weights, "dtype": "auto"}
        assert len(data["models"][setup["ver"]]["base_url"]) == 2
        endpoints = read_endpoints(out)  # what `harness run --endpoints` reads
        assert endpoints[setup["ver"]].urls == tuple(data["models"][setup["ver"]]["base_url"])

        by_port = {r["port"]: r for r in _records(setup)}
        assert sorted(s["port"] for s in data["servers"]) == sorted(by_port)
        for server in data["servers"]:
            record = by_port[server["port"]]
            assert record["pid"] == server["pid"]
            assert record["served"] == server["model"].removeprefix("vllm:")
            pooling = "--runner" in record["argv"]
            assert pooling == (server["model"] == setup["rm"])  # the classifier, on the pooling runner
            assert record["argv"][record["argv"].index("--dtype") + 1] == "auto"
            assert Path(server["log"]).parent == out.with_name("endpoints.yaml.logs")
            assert server["devices"] == [] and record["cuda"] == ""

        # A replica that dies while serving is reported; the others go on.
        dead = next(s for s in data["servers"] if s["model"] == setup["ver"] and s["replica"] == 1)
        os.kill(dead["pid"], signal.SIGKILL)
        wait_until("the exit to be reported", lambda: "exited with code" in stderr.read_text(), (proc, stderr))
        assert proc.poll() is None

        proc.send_signal(stop)
        assert proc.wait(timeout=60) == 0, stderr.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    _assert_no_process_left(_records(setup))
    assert not out.exists()
    assert "stopped 4 servers" in stdout.read_text()


def test_a_failed_start_prints_the_log_tail_exits_2_and_leaves_no_process(setup: dict) -> None:
    config = _config(setup, {setup["ver"]: {"replicas": 2}, setup["gen"]: {"args": ["--fail-after", "4"]}})
    proc, out, stdout, stderr = _serve(setup, config)
    try:
        assert proc.wait(timeout=120) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
    err = stderr.read_text()
    assert "ValueError: the stand-in cannot start" in err and "start-up line 40" in err
    assert "start-up line 12\n" in err and "start-up line 11\n" not in err  # the last 30 lines
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and setup["gen"] in errors[0] and "exited with code 3" in errors[0]
    assert len(_records(setup)) == 4  # every server had started; all are gone now
    _assert_no_process_left(_records(setup))
    assert not out.exists()


def test_each_replica_gets_gpus_of_its_own_and_more_than_there_are_is_refused(setup: dict) -> None:
    two = {"tensor_parallel_size": 2}
    config = _config(setup, {setup["gen"]: two, setup["ver"]: two}, rows=("dr",))
    proc, out, stdout, stderr = _serve(setup, config, "--gpus", "4", "--gpu-memory", "80")
    try:
        wait_until("the endpoints file", out.exists, (proc, stderr))
        servers = {s["model"]: s for s in yaml.safe_load(out.read_text())["servers"]}
        assert servers[setup["gen"]]["devices"] == [0, 1] and servers[setup["ver"]]["devices"] == [2, 3]
        cuda = {r["served"]: r["cuda"] for r in _records(setup)}
        assert cuda == {setup["gen"].removeprefix("vllm:"): "0,1", setup["ver"].removeprefix("vllm:"): "2,3"}
        for record in _records(setup):
            assert record["argv"][record["argv"].index("--tensor-parallel-size") + 1] == "2"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    _assert_no_process_left(_records(setup))

    for path in setup["records"].iterdir():
        path.unlink()
    proc, out, stdout, stderr = _serve(setup, config, "--gpus", "3", "--gpu-memory", "80")
    assert proc.wait(timeout=120) == 2
    assert "need 4 GPUs" in stderr.read_text() and "--gpus 3" in stderr.read_text()
    assert _records(setup) == []  # refused before any server started


def _model(spec: str, *, replicas: int = 1, tp: int = 1, devices: tuple[int, ...] | None = None):
    from harness.serve import ServedModel

    return ServedModel(spec, spec, "/ckpt", None, {}, "auto", "generate", replicas, tp, devices)


def test_device_assignment(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.errors import ConfigError
    from harness.serve import assign_devices, cuda_visible

    assert assign_devices([_model("a", tp=2), _model("b", tp=2)], 4) == {("a", 0): (0, 1), ("b", 0): (2, 3)}
    assert assign_devices([_model("a", replicas=2), _model("b", tp=4)], 8) == {
        ("a", 0): (0,), ("a", 1): (1,), ("b", 0): (2, 3, 4, 5)}
    # Devices the config gives are kept out of the others' way.
    assert assign_devices([_model("a", tp=2), _model("b", replicas=2, devices=(0, 3))], 4) == {
        ("a", 0): (1, 2), ("b", 0): (0,), ("b", 1): (3,)}
    assert assign_devices([_model("a", replicas=2)], None) == {("a", 0): (), ("a", 1): ()}
    with pytest.raises(ConfigError, match=r"need 5 GPUs .*a: 1 x 2; b: 3 x 1.* 4 of --gpus 4 are free"):
        assign_devices([_model("a", tp=2), _model("b", replicas=3)], 4)
    with pytest.raises(ConfigError, match=r"serve.b.devices \[0, 4\]: .* from 0 to 3"):
        assign_devices([_model("b", replicas=2, devices=(0, 4))], 4)
    with pytest.raises(ConfigError, match="no GPUs"):
        assign_devices([_model("b", devices=(0,))], None)

    # Indices count the GPUs `serve` sees: its own CUDA_VISIBLE_DEVICES maps them.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_visible((2, 3)) == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert cuda_visible((0, 1)) == "4,5" and cuda_visible((3,)) == "7"
    with pytest.raises(ConfigError, match="shows 4 GPUs"):
        cuda_visible((4,))


def test_serve_settings_are_checked(setup: dict, tmp_path: Path) -> None:
    from harness.commands.options import Backend, Devices, TableRun
    from harness.commands.setup import table_plan
    from harness.commands.runner import Prepared, build_models
    from harness.config import load_run_config
    from harness.errors import ConfigError
    from harness.pool import BackendPool
    from harness.serve import models_to_serve

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"serve": {setup["gen"]: {"replica": 2}}}))
    with pytest.raises(ConfigError, match=r"serve\..*replica: Extra inputs"):
        load_run_config(bad, {})

    def models(serve: dict):
        plan, options, cfg, served = table_plan("table1", TableRun(config=_config(setup, serve)), Backend(), Devices())
        pool = BackendPool(options=options, endpoints=served)
        ready = build_models(plan, pool, Prepared())
        return models_to_serve(pool, cfg.serve, evaluators=ready.evaluators.values(), devices=None)

    served, notes = models({setup["rm"]: {"args": ["--max-model-len", "128"]}})
    assert [(m.spec, m.runner, m.args[-2:]) for m in served if m.spec == setup["rm"]] == [
        (setup["rm"], "pooling", ("--max-model-len", "128"))]
    assert len(notes) == 1 and setup["token0"] in notes[0]
    with pytest.raises(ConfigError, match="is read with head=lm-token0"):
        models({setup["token0"]: {}})
    with pytest.raises(ConfigError, match="is not local"):
        models({"vllm:/nowhere": {}})


def _serve_refused(setup: dict, config: Path, started: list[dict], *, driver: str = "driver.py") -> str:
    """`harness serve table1` that must be refused: its one error line, once it has exited (it fails the test at
    once should it start a server instead)."""
    argv = [sys.executable, str(setup["dir"] / driver), "serve", "table1", "--config", str(config), "--endpoints",
            str(setup["dir"] / "endpoints.yaml")]
    err = setup["dir"] / "refused.err"
    with err.open("w") as e:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=e, env=setup["env"])
    try:
        wait_until("serve to exit or start a server", lambda: proc.poll() is not None or
                   len(_records(setup)) > len(started))
        assert proc.poll() == 2 and _records(setup) == started, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (line,) = err.read_text().strip().splitlines()
    return line


def test_a_model_that_cannot_be_sized_is_refused_without_gpus_before_any_server_starts(setup: dict) -> None:
    """On a machine without GPUs nothing is fitted, but a config.json `plan` would refuse (10^9 layers) is refused
    here too, before a server is started on it."""
    folder = Path(setup["gen"].removeprefix("vllm:"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 10**9}))
    line = _serve_refused(setup, _config(setup, {}, rows=("dr",)), [])
    assert line.startswith(f"error: cannot size {setup['gen']}: ") and "num_hidden_layers" in line


def _text(path: Path) -> str:
    """The file's text; empty while it does not exist."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _kill_groups(records: list[dict]) -> None:
    for record in records:
        try:
            os.killpg(record["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_one_serve_per_endpoints_file_and_a_killed_one_s_file_is_replaced_once_its_servers_are_gone(
        setup: dict) -> None:
    config = _config(setup, {}, rows=("rm",))
    first, out, stdout, stderr = _serve(setup, config)
    try:
        wait_until("the endpoints file", out.exists, (first, stderr))
        written = out.read_text()
        (log,) = out.with_name("endpoints.yaml.logs").iterdir()
        with log.open("a") as f:
            f.write("a line of the first serve's server\n")
        started = _records(setup)

        line = _serve_refused(setup, config, started)
        assert line.startswith(f"error: {out} is served by another harness serve (pid {first.pid} on ")
        assert "stop it first, or name another --endpoints" in line
        # The first's file, logs and servers are as they were.
        assert out.read_text() == written and "a line of the first serve's server" in log.read_text()
        assert _records(setup) == started and first.poll() is None

        # Killed, the first holds no lock; its server's engine worker outlives it, so its file is not replaced.
        first.kill()
        first.wait(timeout=60)
        wait_until("the server to be gone", lambda: _gone(started[0]["pid"]))
        line = _serve_refused(setup, config, started)
        assert f"{out} lists servers that still run (process groups {started[0]['pid']})" in line
        assert out.read_text() == written and _records(setup) == started
    finally:
        if first.poll() is None:
            first.kill()
        _kill_groups(_records(setup))
    _assert_no_process_left(started)

    # Its servers gone, a new serve takes the file over.
    for path in setup["records"].iterdir():
        path.unlink()
    third, out, stdout, stderr = _serve(setup, config)
    try:
        wait_until("a new endpoints file", lambda: _text(out) not in ("", written), (third, stderr))
        (server,) = yaml.safe_load(out.read_text())["servers"]
        assert server["pid"] == _records(setup)[0]["pid"] != started[0]["pid"]
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=60) == 0, stderr.read_text()
    finally:
        if third.poll() is None:
            third.kill()
    _assert_no_process_left(_records(setup))
    assert not out.exists()


NO_VLLM = '''
import importlib.util

found = importlib.util.find_spec
importlib.util.find_spec = lambda name, *args, **kwargs: None if name == "vllm" else found(name, *args, **kwargs)

from harness.commands.cli import main

main()
'''


def test_without_vllm_serve_is_refused_before_it_makes_any_file(setup: dict) -> None:
    (setup["dir"] / "no_vllm.py").write_text(NO_VLLM)
    line = _serve_refused(setup, _config(setup, {}, rows=("rm",)), [], driver="no_vllm.py")
    assert line.startswith("error: harness serve starts vLLM's OpenAI server: ")
    made = sorted(p.name for p in setup["dir"].iterdir())
    assert made == ["driver.py", "models", "no_vllm.py", "records", "refused.err", "run.yaml", "standin.py"]


def test_device_assignment_needs_no_list_of_every_gpu() -> None:
    from harness.serve import assign_devices

    assert assign_devices([_model("a", tp=2), _model("b", devices=(0,))], 10**15) == {
        ("a", 0): (1, 2), ("b", 0): (0,)}


def test_two_models_devices_may_not_overlap_and_a_replica_gets_tp_times_dp_gpus():
    import dataclasses

    from harness.errors import ConfigError
    from harness.serve import assign_devices, data_parallel_size, left_for_run

    with pytest.raises(ConfigError, match="GPU 1 is also given to a"):
        assign_devices([_model("a", tp=2, devices=(0, 1)), _model("b", tp=2, devices=(1, 2))], 4)
    assert data_parallel_size("m", ["--data-parallel-size", "2"]) == 2
    assert data_parallel_size("m", ["--data-parallel-size=4"]) == 4
    dp = dataclasses.replace(_model("a", tp=2), data_parallel_size=2)
    placed = assign_devices([dp, _model("b")], 8, set_aside=2)
    assert placed == {("a", 0): (0, 1, 2, 3), ("b", 0): (4,)}
    assert left_for_run(placed, 8) == "5,6,7"
    with pytest.raises(ConfigError, match="2 set aside"):
        assign_devices([dp, _model("b", tp=4)], 8, set_aside=2)


def test_serve_fits_tensor_parallelism_with_one_sequence_and_the_profiling_peak(tmp_path: Path):
    import json
    from types import SimpleNamespace

    from harness.plan import Devices
    from harness.serve import fit_tensor_parallel

    config = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 5120,
              "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}  # Qwen3-32B
    (tmp_path / "config.json").write_text(json.dumps(config))
    source = SimpleNamespace(path=str(tmp_path), revision=None)
    options = SimpleNamespace(dtype="auto", max_model_len=40960, enforce_eager=False)
    tp, engine = fit_tensor_parallel("vllm:q32", source, options, Devices(gpus=8, gpu_memory_gib=79.2))
    assert tp == 2 and engine.sequence_gib == 5.0  # 10 GiB a sequence over 2: weights alone fit one card
