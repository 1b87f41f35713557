"""The backend protocol's request and result records: validation and the contexts a request stands for."""

import pytest

from harness.backends.base import LogprobRequest, Message, SamplingParams


@pytest.mark.parametrize(
    ("params", "phrase"),
    [
        ({"n": 0}, "n must be >= 1"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"logprobs": 21}, "logprobs must be in 0..20"),
        ({"min_tokens": -1}, "min_tokens must be in 0..max_tokens=512"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens must be in 0..max_tokens=8"),
    ],
)
def test_sampling_params_reject_impossible_values(params, phrase):
    with pytest.raises(ValueError, match=phrase):
        SamplingParams(**params)


def test_min_tokens_may_equal_max_tokens():
    assert SamplingParams(max_tokens=8, min_tokens=8).min_tokens == 8


def test_branches_complete_the_last_message():
    chat = (Message("system", "Be brief."), Message("user", "Criterion: "))
    request = LogprobRequest(chat, branches=("is short", "is polite"))
    assert request.contexts() == [
        (Message("system", "Be brief."), Message("user", "Criterion: is short")),
        (Message("system", "Be brief."), Message("user", "Criterion: is polite")),
    ]
    assert LogprobRequest(chat).contexts() == [chat]
    with pytest.raises(ValueError, match="needs a message"):
        LogprobRequest((), branches=("x",))

