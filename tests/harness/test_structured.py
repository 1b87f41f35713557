"""Structured output: the `Constraint` request field, its grammar, the hf logits mask, and the call-cache key."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tiny_models import build_tiny_lm  # noqa: E402

from harness.backends import load_backend  # noqa: E402
from harness.backends.base import BackendOptions, Constraint, GenerateRequest, SamplingParams, user_chat  # noqa: E402
from harness.backends.grammar import lark_grammar  # noqa: E402
from harness.cache import _generate_payload, cache_key  # noqa: E402

RUBRIC = {
    "type": "array",
    "minItems": 1,
    "maxItems": 3,
    "items": {
        "type": "object",
        "properties": {
            "criterion": {"type": "string", "minLength": 1, "maxLength": 20},
            "weight": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["criterion", "weight"],
        "additionalProperties": False,
    },
}


def _valid_rubric(text: str) -> bool:
    data = json.loads(text)
    return (
        isinstance(data, list)
        and 1 <= len(data) <= 3
        and all(
            set(item) == {"criterion", "weight"}
            and isinstance(item["criterion"], str)
            and 1 <= len(item["criterion"]) <= 20
            and type(item["weight"]) is int
            and 1 <= item["weight"] <= 5
            for item in data
        )
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(build_tiny_lm(tmp_path_factory.mktemp("structured") / "m", byte_level=True))


def _generate(model: str, requests: list[GenerateRequest]):
    backend = load_backend(f"hf:{model}", BackendOptions(dtype="float32"))
    try:
        return asyncio.run(backend.generate(requests))
    finally:
        asyncio.run(backend.close())


def test_a_random_model_under_the_rubric_schema_writes_valid_rubrics_for_20_seeds(tiny: str):
    constraint = Constraint.json_schema(RUBRIC, name="rubric")
    requests = [
        GenerateRequest(user_chat("rubric?"), SamplingParams(max_tokens=200, temperature=1.0, seed=s, constraint=constraint))
        for s in range(20)
    ]
    free = [GenerateRequest(r.messages, SamplingParams(max_tokens=60, temperature=1.0, seed=i)) for i, r in
            enumerate(requests[:5])]
    out = _generate(tiny, requests + free)
    texts = [c.texts[0] for c in out[:20]]
    assert all(c.ok for c in out)
    assert [t for t in texts if not _valid_rubric(t)] == []
    assert len(set(texts)) > 10  # sampled: the mask restricts, it does not fix the output
    assert not any(_is_json(c.texts[0]) for c in out[20:])  # the same model unconstrained writes no JSON


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_choice_and_regex_constraints(tiny: str):
    choice = Constraint.choice(["yes", "no"])
    regex = Constraint.regex(r"[0-9]{2}-[a-c]{3}")
    requests = [GenerateRequest(user_chat("q"), SamplingParams(max_tokens=20, temperature=1.0, seed=s, constraint=c))
                for s in range(6) for c in (choice, regex)]
    texts = [c.texts[0] for c in _generate(tiny, requests)]
    import re

    assert set(texts[0::2]) <= {"yes", "no"}
    assert all(re.fullmatch(r"[0-9]{2}-[a-c]{3}", t) for t in texts[1::2]), texts[1::2]


def test_the_grammar_allows_a_thinking_block_only_when_asked(tiny: str):
    from transformers import AutoTokenizer

    from harness.backends.grammar import TokenMask

    mask = TokenMask(AutoTokenizer.from_pretrained(tiny))
    thinking = '<think>\nThe answer: yes, or no? </b>\n</think>\n\n"yes"'

    def accepts(constraint: Constraint, text: str) -> bool:
        matcher = mask.matcher(constraint)
        ids = mask.tokenizer.tokenize_str(text)
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()

    schema = Constraint.json_schema({"enum": ["yes", "no"]}, think=True)
    assert accepts(schema, thinking) and accepts(schema, '"no"')
    assert not accepts(Constraint.json_schema({"enum": ["yes", "no"]}), thinking)
    assert not accepts(schema, '<think>ok</think> "maybe"')
    assert "think" not in lark_grammar(Constraint.choice(["a"]))


def test_the_constraint_is_part_of_the_cache_key():
    identity = {"kind": "hf", "model": "m"}
    plain = GenerateRequest(user_chat("q"), SamplingParams())
    keys = {
        cache_key(identity, "generate", _generate_payload(GenerateRequest(plain.messages, SamplingParams(constraint=c))))
        for c in (None, Constraint.choice(["yes", "no"]), Constraint.choice(["no", "yes"]),
                  Constraint.json_schema(RUBRIC), Constraint.json_schema(RUBRIC, think=True))
    }
    assert len(keys) == 5
    # An unconstrained request keeps the key it had before constraints existed.
    assert "constraint" not in _generate_payload(plain)


def test_bad_constraints_are_clear_errors(tiny: str):
    with pytest.raises(ValueError, match="at least one option"):
        Constraint.choice([])
    with pytest.raises(ValueError, match="unknown constraint kind"):
        Constraint("grammar", "x")
    out = _generate(tiny, [GenerateRequest(user_chat("q"), SamplingParams(max_tokens=5,
                                                                          constraint=Constraint.regex("(")))])
    assert not out[0].ok and "regex" in out[0].error.message


def test_a_schema_keeps_its_key_order_independent_canonical_form():
    a = Constraint.json_schema({"type": "object", "required": ["x"]})
    b = Constraint.json_schema({"required": ["x"], "type": "object"})
    assert a == b and hash(a) == hash(b)


def test_the_order_of_properties_is_kept_because_the_model_writes_them_in_it():
    from harness.backends.grammar import lark_grammar

    reason_first = {"type": "object", "properties": {"why": {"type": "string"}, "score": {"type": "integer"}}}
    score_first = {"properties": {"score": {"type": "integer"}, "why": {"type": "string"}}, "type": "object"}
    a, b = Constraint.json_schema(reason_first), Constraint.json_schema(score_first)
    assert a != b and list(a.schema["properties"]) == ["why", "score"]
    grammar = lark_grammar(a)
    assert grammar.index('"why"') < grammar.index('"score"')


def test_an_unreadable_tokenizer_falls_back_to_free_text(tmp_path: Path, caplog):
    """A tokenizer llguidance cannot read (here: Metaspace) generates without the mask, with one warning."""
    model = str(build_tiny_lm(tmp_path / "metaspace"))
    requests = [GenerateRequest(user_chat("q"), SamplingParams(max_tokens=8, constraint=Constraint.choice(["yes"])))]
    with caplog.at_level("WARNING"):
        out = _generate(model, requests * 2)
    assert all(c.ok for c in out)
    warnings = [r for r in caplog.records if "structured output" in r.getMessage()]
    assert len(warnings) == 1 and "without the constraint" in warnings[0].getMessage()


# --- the openai backend: the constraint in the forms a server accepts, and plain requests where it takes none ---


class FussyServer:
    """A loopback chat server that accepts only some structured-output forms (the rest: the status given)."""

    def __init__(self, accepts: set[str], refusal: int = 400) -> None:
        self.accepts = accepts
        self.refusal = refusal
        self.bodies: list[dict] = []

    async def __call__(self, request):
        from harness.loopback import chat_completion, json_response

        if request.path.endswith("/models"):
            return json_response({"object": "list", "data": []})
        body = request.json()
        self.bodies.append(body)
        form = None
        if "response_format" in body:
            form = "json_schema" if body["response_format"]["type"] == "json_schema" else "json_object_schema"
        elif "structured_outputs" in body:
            form = "structured_outputs"
        elif any(k.startswith("guided_") for k in body):
            form = "guided"
        elif "grammar" in body:
            form = "gbnf"
        if form is not None and form not in self.accepts:
            return json_response({"error": {"message": f"Input should be 'text' or 'json_object' ({form})"}},
                                 status=self.refusal)
        text = '[{"criterion": "Is it correct?", "weight": 3}]' if form else "Sure! Here is a rubric: ..."
        return json_response(chat_completion([text]))


async def _generate_and_close(backend, requests):
    try:
        return await backend.generate(requests)
    finally:
        await backend.close()


def _openai(url: str):
    from harness.backends.openai_backend import OpenAIBackend

    return OpenAIBackend("m", BackendOptions(base_url=url, max_attempts=3))


@pytest.mark.parametrize(
    ("accepts", "refusal", "form"),
    [({"json_schema"}, 400, "json_schema"), ({"json_object_schema"}, 500, "json_object_schema")],
)
def test_openai_sends_the_schema_in_the_form_the_server_accepts(accepts, refusal, form):
    from harness.loopback import serve_in_thread

    server = FussyServer(accepts, refusal)
    constraint = Constraint.json_schema(RUBRIC, name="rubric")
    requests = [GenerateRequest(user_chat(f"q{i}"), SamplingParams(constraint=constraint)) for i in range(4)]
    with serve_in_thread(server) as url:
        backend = _openai(url)
        out = asyncio.run(_generate_and_close(backend, requests))
    assert all(c.ok and _valid_rubric(c.texts[0]) for c in out)
    refused = 0 if form == "json_schema" else 1  # one probe of the refused form, then the accepted one only
    assert len(server.bodies) == len(requests) + refused
    sent = server.bodies[-1]["response_format"]
    assert (sent["type"], sent.get("json_schema", {}).get("name")) == (
        ("json_schema", "rubric") if form == "json_schema" else ("json_object", None))
    assert backend.probed() == {"structured output (json_schema)": form} and backend.capabilities() == {}


def test_openai_falls_back_to_plain_requests_when_the_server_takes_no_form():
    from harness.loopback import serve_in_thread

    server = FussyServer(set(), 500)
    requests = [GenerateRequest(user_chat(f"q{i}"), SamplingParams(constraint=Constraint.choice(["yes", "no"])))
                for i in range(3)]
    with serve_in_thread(server) as url:
        backend = _openai(url)
        out = asyncio.run(_generate_and_close(backend, requests))
    assert all(c.ok for c in out) and out[0].texts == ("Sure! Here is a rubric: ...",)
    # Each form probed once (no retries), then plain requests only.
    assert [("structured_outputs" in b, any(k.startswith("guided_") for k in b), "grammar" in b)
            for b in server.bodies[:3]] == [(True, False, False), (False, True, False), (False, False, True)]
    assert server.bodies[2]["grammar"] == 'root ::= "yes" | "no"\n'
    assert len(server.bodies) == 3 + 3
    caps = backend.capabilities()
    assert caps["structured output (choice)"].startswith("unsupported (structured_outputs: HTTP 500")
    assert "guided: HTTP 500" in caps["structured output (choice)"]


def test_bench_structured_on_a_random_model(tmp_path: Path):
    """Free, a random model writes nothing parsable; constrained, every rubric (the grammar closes within its
    budget, even spelled a byte per token), verdict and sheet parses; jump-forward gives the same answers."""
    from harness.commands.bench_structured import format_bench_structured, run_bench_structured

    model = build_tiny_lm(tmp_path / "long", byte_level=True, context=8192)
    results = asyncio.run(run_bench_structured(f"hf:{model}", rubrics=3, max_tokens=96, items=2, responses=2,
                                               options=BackendOptions(dtype="float32")))
    by = {(r.task, r.output): r for r in results}
    outputs = ("free", "constrained", "jump-forward")
    assert [k for k in by] == [(t, o) for t in ("rubric", "per_item", "batched") for o in outputs]
    assert all(by[(t, o)].parse_failures == 0 for t in ("rubric", "per_item", "batched") for o in outputs[1:])
    assert all(by[(t, "free")].parse_failures == by[(t, "free")].requests for t in ("rubric", "per_item", "batched"))
    tasks = ("rubric", "per_item", "batched")
    assert all(by[(t, "jump-forward")].answers == by[(t, "constrained")].answers for t in tasks)
    assert by[("rubric", "jump-forward")].forced_tokens > 0 and by[("rubric", "constrained")].forced_tokens == 0
    assert by[("per_item", "constrained")].requests == 4
    text = format_bench_structured(results, spec="tiny")
    assert "rubric: parse failures 3/3 free, 0/3 constrained; " in text and "decode throughput constrained/free" in text
    assert "x with jump-forward (" in text and "of its tokens forced" in text
    assert "per_item: parse failures" in text and "verdicts agree with free" in text
