"""The README's CI recipe for `harness compare`, run as written (its shell block, in bash).

Both checkpoints and the verifier are models of a loopback OpenAI-compatible server, so the recipe's real
commands run in seconds: a candidate whose rubric scores every pair a tie must fail the job (exit 1), one that
writes the baseline's rubric must pass it (exit 0).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.loopback import chat_completion, json_response, serve_in_thread

README = Path(__file__).resolve().parents[2] / "README.md"
RUBRICS = {
    "gen-a": [{"criterion": "The response answers the question that was asked.", "weight": 3}],
    "gen-b": [{"criterion": "The response answers the question that was asked.", "weight": 3}],
    "gen-tie": [{"criterion": "The response is written in a natural language.", "weight": 2}],
}


async def server(request):
    if request.path.endswith("/models"):
        return json_response({"object": "list", "data": []})
    body = request.json()
    text = body["messages"][-1]["content"]
    if body["model"] in RUBRICS:
        return json_response(chat_completion([json.dumps(RUBRICS[body["model"]])]))
    if "natural language" in text:
        return json_response(chat_completion(["Yes"]))
    # The verifier: a verdict fixed by the request (criterion and response), so both runs see the same answers.
    yes = hashlib.sha256(text.encode()).digest()[0] % 2
    return json_response(chat_completion(["Yes" if yes else "No"]))


def recipe() -> str:
    match = re.search(r"<!-- ci-recipe -->\n```bash\n(.*?)```\n<!-- /ci-recipe -->", README.read_text(), re.S)
    assert match, "README.md lost its ci-recipe block"
    return match.group(1)


@pytest.mark.slow
def test_the_readme_ci_recipe_fails_a_regressed_checkpoint_and_passes_an_equal_one(tmp_path: Path,
                                                                                    shared_data: Path):
    with serve_in_thread(server) as url:
        env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "test",
               "HARNESS_CALL_CACHE": str(tmp_path / "calls.sqlite"), "VERIFIER": "openai:verifier",
               "BASELINE_CKPT": "openai:gen-a",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "LIMIT": "40", "DATA_DIR": str(shared_data)}
        script = recipe()
        runs = {}
        for commit, candidate in (("tied", "gen-tie"), ("same", "gen-b")):
            runs[commit] = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                                          timeout=300, env={**env, "CANDIDATE_CKPT": f"openai:{candidate}", "COMMIT": commit})
    assert runs["tied"].returncode == 1, runs["tied"].stderr
    assert runs["same"].returncode == 0, runs["same"].stderr
    tied = json.loads((tmp_path / "runs" / "candidate-tied" / "compare.json").read_text())
    (cell,) = tied["cells"]
    assert cell["verdict"] == "regression" and cell["candidate"] == 0.0 and cell["n_items"] == 40
    same = json.loads((tmp_path / "runs" / "candidate-same" / "compare.json").read_text())
    assert same["cells"][0]["diff"] == 0.0 and same["cells"][0]["verdict"] == "no significant change"
