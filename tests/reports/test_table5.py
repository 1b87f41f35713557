"""Table 5, generators x verifiers: a generator's rubric for a set is generated once and verified by every
verifier, so its requests are those of one verifier column; identical requests in flight at once are sent once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rubric_server import RubricServer, harness, results

from harness.backends.base import BaseBackend, Completion, GenerateRequest, SamplingParams, Usage, user_chat
from harness.cache import CachedBackend, CallCache
from harness.config import RunConfig
from harness.errors import ConfigError
from harness.loopback import serve_in_thread
from reports.tables import get_table


class HeldBackend(BaseBackend):
    """Answers `ok` once `release` is set; counts the requests it got."""

    kind = "held"
    model = "held"

    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def generate(self, requests):
        self.requests += requests
        self.entered.set()
        await self.release.wait()
        return [Completion(("ok",), Usage(3, 1)) for _ in requests]


def test_identical_requests_in_flight_at_once_are_sent_once(tmp_path: Path):
    async def go():
        backend = HeldBackend()
        cached = CachedBackend(backend, CallCache(tmp_path / "calls.sqlite"))
        request = GenerateRequest(user_chat("write a rubric"), SamplingParams(temperature=0.7, seed=5))
        first = asyncio.create_task(cached.generate([request]))
        second = asyncio.create_task(cached.generate([request, request]))
        await backend.entered.wait()
        backend.release.set()
        a, b = await first, await second
        assert len(backend.requests) == 1 and cached.calls == 1 and cached.hits == 2
        assert a[0].texts == b[0].texts == b[1].texts == ("ok",)
        assert (a[0].cached, b[0].cached, b[1].cached) == (False, True, True)
        assert b[0].usage == Usage()  # spent once, by the request that was sent
        assert (await cached.generate([request]))[0].cached and len(backend.requests) == 1

    asyncio.run(go())


RUBRICS = {"gen-a": [("The response contains a digit.", 3), ("The response mentions water.", 2)],
           "gen-b": [("The response is longer than 300 characters.", 4)]}


def test_each_generator_writes_one_rubric_per_set_whatever_the_verifiers(tmp_path: Path, shared_data: Path):
    server = RubricServer(RUBRICS)
    config = tmp_path / "table5.yaml"
    with serve_in_thread(server) as url:
        config.write_text(json.dumps({
            "generators": {"G-a": "openai:gen-a", "G-b": "openai:gen-b"},
            "verifiers": {"V-1": "openai:ver-1", "V-2": "openai:ver-2", "V-3": "openai:ver-3"},
            "benchmarks": ["ultrafeedback"], "backend": {"base_url": url, "concurrency": 8}}))
        args = ["run", "table5", "--config", str(config), "--limit", "3", "--seeds", "2", "--data-dir",
                str(shared_data), "--out", str(tmp_path / "out")]
        env = {"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")}
        done = harness(*args, env=env)
        assert done.returncode == 0, done.stderr
        # 3 sets x 2 repeats: one rubric each, as one verifier column asks, not one per verifier (18)
        assert (server.count("gen-a"), server.count("gen-b")) == (6, 6)
        # each verifier answers each of its items on both responses of every set: (2 + 1) items x 2 x 6
        assert [server.count(f"ver-{v}") for v in (1, 2, 3)] == [18, 18, 18]
        again = harness(*args, env=env)
        assert again.returncode == 0 and "backend calls: 0" in again.stdout
        assert sum(server.requests.values()) == 66
    found = results(tmp_path / "out")
    assert list(found["rows"]) == ["V-1 / G-a", "V-1 / G-b", "V-2 / G-a", "V-2 / G-b", "V-3 / G-a", "V-3 / G-b"]
    assert found["rows"]["V-2 / G-b"] == "dynamic-rubric:generator=openai:gen-b,verifier=openai:ver-2"
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| V-3 / G-b | - | - | - | " in table and "| *paper* | - | - | - | - | - | - | - | - |" in table


def test_table_specific_keys_are_read_only_by_their_tables():
    with pytest.raises(ConfigError, match="generators: read by table5, not by table1"):
        get_table("table1").resolve(RunConfig(generators={"G": "openai:g"}))
    with pytest.raises(ConfigError, match="coevolve: read by fig2a, fig2b, table9, not by table5"):
        get_table("table5").resolve(RunConfig(coevolve=Path("co")))
    with pytest.raises(ConfigError, match="fig2 is drawn from the runs of its panels"):
        get_table("fig2").resolve(RunConfig())
    spec, _ = get_table("table5").resolve(RunConfig(verifiers={"V": "openai:v"}))
    assert [r.label for r in spec.rows] == ["V / Qwen3-8B zero-shot", "V / Qwen3-32B zero-shot", "V / DR-Generator-8B"]


def test_labels_that_make_one_row_twice_are_refused(tmp_path: Path):
    """A generator `X / Y` under verifier `A` and a generator `Y` under verifier `A / X` both print `A / X / Y`:
    the config is refused, naming both pairs, before anything runs."""
    clash = RunConfig(generators={"X / Y": "openai:g1", "Y": "openai:g2"},
                      verifiers={"A": "openai:v1", "A / X": "openai:v2"})
    with pytest.raises(ConfigError, match=r"generator 'X / Y' with verifier 'A' and generator 'Y' with verifier "
                                          r"'A / X' both make the row 'A / X / Y'"):
        get_table("table5").resolve(clash)
    spec, _ = get_table("table5").resolve(RunConfig(generators={"X / Y": "openai:g1", "Y": "openai:g2"},
                                                    verifiers={"A": "openai:v1", "B": "openai:v2"}))
    assert [r.label for r in spec.rows] == ["A / X / Y", "A / Y", "B / X / Y", "B / Y"]
    config = tmp_path / "table5.yaml"
    config.write_text(json.dumps({"generators": clash.generators, "verifiers": clash.verifiers}))
    done = harness("run", "table5", "--config", str(config), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: generators x verifiers: ") and "rename a label" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["generators", "verifiers"])
def test_an_empty_generators_or_verifiers_mapping_is_refused_not_taken_for_the_defaults(tmp_path: Path, key: str):
    with pytest.raises(ConfigError, match=f"{key}: empty; name at least one"):
        get_table("table5").resolve(RunConfig(**{key: {}}))
    with pytest.raises(ConfigError, match=f"{key}: read by table5, not by table1"):
        get_table("table1").resolve(RunConfig(**{key: {}}))
    config = tmp_path / "table5.yaml"
    config.write_text(f"{key}: {{}}\n")
    done = harness("run", "table5", "--config", str(config), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and done.stderr == f"error: {key}: empty; name at least one (label: model spec), " \
                                                   f"or leave {key} out for table5's own\n", done.stderr
