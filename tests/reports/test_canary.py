"""`harness compare`'s drift canary: a verifier behind the same name that answers otherwise after a restart makes
the runs incomparable (exit 2, naming it); one that answers as before passes; models pinned by weights are left out
unless asked; a server that cannot be reached is said, not hidden."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

from rubric_server import RubricServer, harness

from harness.commands.canary import pinned
from harness.loopback import json_response, serve_in_thread

RUBRICS = {"gen-a": [("The response contains a digit.", 3), ("The response mentions water.", 2)],
           "gen-b": [("The response is longer than 300 characters.", 4)]}


class FlippingServer(RubricServer):
    """The rubric server whose verifier, once `flip` is set, answers the opposite on that share of its requests
    (chosen by the request's text, so the same request always flips or always not)."""

    flip = 0.0

    async def __call__(self, request):
        answer = await super().__call__(request)
        body = request.json() if request.path.endswith("/chat/completions") else {}
        if body.get("model") == "ver" and self.flip:
            text = json.dumps(body["messages"])
            if int(hashlib.sha256(text.encode()).hexdigest(), 16) % 100 < self.flip * 100:
                said = json.loads(answer.body)
                choice = said["choices"][0]["message"]
                choice["content"] = "No" if choice["content"] == "Yes" else "Yes"
                return json_response(said)
        return answer


def _runs(tmp_path: Path, url: str, shared_data: Path) -> tuple[Path, Path]:
    runs = []
    for name, generator in (("base", "gen-a"), ("cand", "gen-b")):
        out = tmp_path / name
        done = harness("eval", "-e", f"dynamic-rubric:generator=openai:{generator},verifier=openai:ver", "-b",
                       "ultrafeedback", "--label", "DR", "--limit", "6", "--data-dir", str(shared_data),
                       "--base-url", url, "--out", str(out),
                       env={"HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite")})
        assert done.returncode == 0, done.stderr
        runs.append(out)
    return runs[0], runs[1]


def test_a_verifier_that_changed_under_its_name_is_caught_and_one_that_did_not_passes(tmp_path: Path,
                                                                                    shared_data: Path):
    server = FlippingServer(RUBRICS)
    with serve_in_thread(server) as url:
        base, cand = _runs(tmp_path, url, shared_data)
        asked = server.count("ver")
        same = harness("compare", str(base), str(cand), "--out", str(tmp_path / "same"))
        assert same.returncode != 2, same.stderr
        canary = json.loads((tmp_path / "same" / "compare.json").read_text())["canary"]
        (model,) = canary["models"]
        assert model["spec"] == "openai:ver" and model["agreement"] == 1.0
        with sqlite3.connect(base / "calls.sqlite") as db:
            stored = sum(json.loads(who)["model"] == "ver" for (who,) in db.execute("SELECT identity FROM requests"))
        assert model["asked"] == canary["calls"] == min(32, stored) > 0  # every verifier request is greedy
        assert server.count("ver") == asked + model["asked"]  # re-asked without the cache
        assert "Drift canary: " in (tmp_path / "same" / "compare.md").read_text()

        server.flip = 0.5  # "restarted with other weights": about half the verdicts change
        drifted = harness("compare", str(base), str(cand), "--out", str(tmp_path / "drift"))
        assert drifted.returncode == 2, drifted.stdout + drifted.stderr
        assert "drift canary: openai:ver answered" in drifted.stderr and "re-asked requests" in drifted.stderr
        report = json.loads((tmp_path / "drift" / "compare.json").read_text())
        (model,) = report["canary"]["models"]
        assert model["agreement"] < 0.9 and model["differing"] and report["comparable"] is False

        skipped = harness("compare", str(base), str(cand), "--canary", "0", "--out", str(tmp_path / "off"))
        assert skipped.returncode != 2 and json.loads((tmp_path / "off" / "compare.json").read_text())[
            "canary"] is None
        lenient = tmp_path / "gate.yaml"
        lenient.write_text("canary_min_agreement: 0.2\n")
        passed = harness("compare", str(base), str(cand), "--config", str(lenient), "--out", str(tmp_path / "low"))
        assert passed.returncode != 2, passed.stderr
    unreachable = harness("compare", str(base), str(cand), "--out", str(tmp_path / "down"))
    assert unreachable.returncode != 2 and "drift canary: not re-asked: openai:ver: " in unreachable.stderr


def test_models_pinned_by_their_weights_are_left_out_unless_asked():
    assert pinned({"kind": "hf", "model": "m", "weights": "abc"}) and pinned({"kind": "vllm", "revision": "r1"})
    assert not pinned({"kind": "openai", "model": "gpt-4.1", "base_url": "https://api.openai.com/v1"})
