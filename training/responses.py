"""What one Nectar response is, as Appendix B's rules read it: broken, a plain refusal, a refusal with a helpful
alternative, greeting-only, clarification-only, boilerplate, repetitive, or none of these.

The paper defines the kinds in words; the tests that decide them here are ours (phrase patterns over a response's
sentences, checked on the authors' Nectar rows in `../shared/data/nectar`):

- **broken**: nothing a reader could use: empty once stripped, no letter or digit, a decoding failure (U+FFFD) or
  a control character, or under `min_alnum_share` (0.3) letters and digits among its visible characters. A short
  answer is not broken: Nectar's classification prompts are answered by `C`, `True` or `Serotonin`.
- **refusal**: its first sentence declines the request (`I'm sorry, but I can't assist with that`, `I cannot
  fulfill your request`, `As an AI, I'm unable to ...`). It is a **refusal with a helpful alternative** when what
  follows the declining phrase, courtesy offers and lectures left out (`If you have any other questions ...`,
  `It's important to ...`), offers help of another kind: a phrase such as `however`, `instead`, `I can guide you`,
  `I would recommend`, `here are`, `you could try`, in at least `min_alternative_chars` (40) characters. Otherwise
  it is a **plain refusal**.
- **greeting-only**: every clause is a greeting or a pleasantry (`Hello! How can I assist you today?`, `Sure, I
  can help with that.`, `You are welcome.`).
- **clarification-only**: at most `max_clarification_chars` (400) characters and no list, asking the user for
  more (a question addressed to the user, or a request such as `Could you please provide more context?`) and
  saying nothing else than apologies, pleasantries and restatements of what is missing.
- **boilerplate**: opens with an AI disclaimer (`As an AI language model, I don't have personal opinions`) and
  offers nothing after it (the same test as a refusal's alternative).
- **repetitive**: of its word 3-grams (responses of at least 30 words), fewer than `min_unique_trigrams` (0.5)
  distinct.

`classify` gives one kind per response, in the order broken, plain refusal, greeting-only, clarification-only,
boilerplate; a refusal with a helpful alternative is none of them (Appendix B counts it as useful).
"""

from __future__ import annotations

import re
from enum import StrEnum

_WORD = re.compile(r"\w+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_CLAUSE = re.compile(r"[,.!?;:]+")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
_LIST = re.compile(r"(?m)^\s*(?:\d+[.)]|[-*\u2022])\s+\S")

_DECLINE = re.compile(
    r"\bi\s*(?:'m|am)?\s*(?:really\s+|very\s+)?(?:"
    r"(?:can\s*not|can't|cannot|won't|will not|must not|should not)\s+(?:be able to\s+)?"
    r"(?!believe|wait|help but|stress|emphasi[sz]e|thank|imagine|get enough|express|tell you how|agree|overstate|"
    r"conclude|determine|infer|deduce|be sure)"
    r"\w+"
    r"|(?:am|'m)\s+(?:currently\s+|simply\s+|afraid\s+i(?:'m| am)\s+)?(?:not able|unable|not capable|not programmed|"
    r"not equipped|not allowed|not permitted)"
    r"|unable to|not able to|must decline|(?:do not|don't) feel comfortable|refuse to"
    r"|(?:do not|don't) have (?:[\w-]+,? ){0,4}?(?:the (?:ability|capability|capacity)|access|real-time|enough "
    r"(?:information|context)))",
    re.IGNORECASE,
)
"""A declining phrase: the assistant says it cannot, will not or is unable to do what was asked (not an idiom such
as `I can't wait`, nor a reasoning answer such as `I cannot conclude that ...`)."""
_DISCLAIMER = re.compile(
    r"^(?:[^.!?]{0,60}\b)?(?:as an? (?:[\w-]+ ){0,4}(?:ai|language model|artificial intelligence|assistant|"
    r"chatbot)\b|i(?:'m| am) (?:just |only )?an? (?:[\w-]+ ){0,3}(?:ai|language model|artificial intelligence)\b)",
    re.IGNORECASE,
)
"""An AI disclaimer at the start of a sentence (`As an AI language model, ...`, `I'm just an AI, ...`)."""
_OFFER = re.compile(
    r"\b(?:however|instead|alternatively|that said|with that said|"
    r"but i can|i can (?:certainly |still |definitely |though |however )?(?:help|provide|offer|suggest|guide|give|"
    r"share|tell|explain|describe|recommend|outline|draft|walk|show|point)|"
    r"i(?:'d| would) (?:be (?:more than )?(?:happy|glad) to|recommend|suggest|advise you to)|i (?:recommend|suggest)|"
    r"here(?: is|'s| are)|below (?:is|are)|"
    r"you (?:could|can|might|may|should) (?:try|use|contact|consult|check|consider|look|visit|search|find|ask|"
    r"reach|call|speak|talk to)|"
    r"(?:it's|it is|it would be) (?:best|better|advisable|recommended) to|please consider|consider (?:using|"
    r"contacting|reaching|asking|checking|looking|trying|talking|speaking|seeking|visiting))\b",
    re.IGNORECASE,
)
"""A phrase that offers help of another kind after a refusal or a disclaimer."""
_REFERRAL = re.compile(
    r"\b(?:reach out|talk(?: things over)?|speak|seek (?:help|support|advice)|call) (?:to |with |from )?(?:a|an|"
    r"someone|the|your)\b",
    re.IGNORECASE,
)
"""Sending the user to someone who can help (a professional, a hotline): an alternative even inside a warning."""
_COURTESY = re.compile(
    r"\b(?:any (?:other|more|further) (?:questions?|requests?|topics?)|anything else|something else|"
    r"different (?:topic|request|question)|feel free|let me know if|i(?:'m| am) here to (?:help|assist|provide)|"
    r"my (?:purpose|goal|role) is|i(?:'m| am) (?:designed|programmed|committed|here) to|happy to help with (?:any|"
    r"other)|(?:how|what) (?:can|may) i (?:help|assist|do)|is there (?:anything|something))\b",
    re.IGNORECASE,
)
"""A courtesy sentence: a generic offer to help with something else, or what the assistant is for."""
_LECTURE = re.compile(
    r"^(?:additionally, |also, |but |however, |instead, )?(?:it(?:'s| is) (?:really |very |always |also )?"
    r"(?:important|crucial|essential|vital) (?:to (?:always )?(?:respect|remember|follow|treat|prioriti[sz]e|"
    r"maintain|avoid|abide|obey|be (?:respectful|mindful|kind|careful))|for (?:everyone|all))|"
    r"it(?:'s| is) (?:never|not) (?:appropriate|ethical|legal|okay|ok|acceptable)|please (?:remember|note|be aware)|"
    r"remember (?:that|to)|i (?:strongly )?(?:advise|encourage|urge) (?:against|you not)|"
    r"(?:this|that|it|doing so|such (?:content|behaviou?r)) (?:is|would be|could be|can be) "
    r"(?:illegal|unethical|harmful|dangerous|against|inappropriate|offensive|not appropriate))",
    re.IGNORECASE,
)
"""A lecture sentence: a warning or a moral note, no help."""
_PLEASANTRY = re.compile(
    r"^(?:(?:hi|hello|hey|greetings|howdy)(?: there| again| everyone)?|good (?:morning|afternoon|evening|day)|"
    r"(?:it's |it is )?nice to (?:meet|see) you|you(?:'re| are) (?:very |most )?welcome|thank(?:s| you)(?: so much|"
    r" very much| for (?:asking|reaching out))?|no problem|sure(?: thing)?|of course|certainly|absolutely|okay|ok|"
    r"great|that's great|that is great|awesome|wonderful|"
    r"(?:how|what) (?:can|may) i (?:help|assist|do for) you(?: with(?: \w+){1,4})?(?: today)?|"
    r"how (?:can|may) i (?:help|assist)(?: you)?(?: today)?|how are you(?: doing)?(?: today)?|"
    r"i(?:'m| am) (?:here|happy|glad) to (?:help|assist)(?: you)?(?: today)?|"
    r"(?:i can|i'd be happy to|i would be happy to|i'd be glad to|i would be glad to|happy to|glad to) "
    r"(?:help|assist)(?: you)?(?: with (?:that|this))?(?: too| as well)?|"
    r"what can i do for you(?: today)?|let me know how i can help(?: you)?)$",
    re.IGNORECASE,
)
"""A whole clause that is a greeting or a pleasantry."""
_ASKS = re.compile(
    r"\b(?:(?:could|can|would) you (?:please )?(?:provide|clarify|specify|share|give|tell|explain|rephrase|"
    r"elaborate|send|paste|include|describe|let me know)|please (?:provide|clarify|specify|share|give|rephrase|"
    r"elaborate|send|paste|include|tell)|more (?:context|details?|information|specifics?)|let me know (?:what|which|"
    r"how|more|the)|i(?:'d| would)? need (?:more|some|the)|it would (?:be helpful|help) if you|"
    r"what do you mean|i(?:'m| am) not sure what you|(?:don't|do not) (?:understand|have enough (?:context|"
    r"information))|(?:didn't|did not|haven't|have not) (?:provide|include|share|specif)|"
    r"this (?:will|would|might|could|may) help me|so (?:that )?i can|(?:once|when|if) you (?:could |can )?"
    r"(?:provide|share|send|paste|tell)|(?:it's|it is) (?:not clear|unclear) what)\b",
    re.IGNORECASE,
)
"""A request for clarification, or the reason one is needed."""
_YOU = re.compile(r"\byou(?:r|rs|'re|'ve|'d|'ll)?\b", re.IGNORECASE)
_APOLOGY = re.compile(r"^(?:i(?:'m| am) (?:really |so |very )?sorry|i apologi[sz]e|sorry|unfortunately|"
                      r"it seems (?:like |that )?(?:you|there|the)|i(?:'m| am) afraid|i(?:'m| am) not (?:sure|certain)"
                      r"|(?:sure|great|certainly|of course|absolutely|okay|ok)?[,!.]?\s*i(?:'d| would|'ll| will)? "
                      r"(?:be )?(?:more than )?(?:happy|glad) to (?:help|assist|do))\b", re.IGNORECASE)
"""A sentence a clarification request may open or close with: an apology, a hedge, an offer to help once told."""


class Kind(StrEnum):
    """What a response is, as Appendix B's rules count it (`classify`)."""

    BROKEN = "broken"
    GREETING_ONLY = "greeting_only"
    CLARIFICATION_ONLY = "clarification_only"
    PLAIN_REFUSAL = "plain_refusal"
    BOILERPLATE = "boilerplate"
    OK = "ok"
    """None of the others: an answer, or a refusal with a helpful alternative."""


DEGENERATE = frozenset({Kind.BROKEN, Kind.PLAIN_REFUSAL, Kind.GREETING_ONLY, Kind.CLARIFICATION_ONLY})
"""The kinds the paper calls degenerate."""


def sentences(text: str) -> list[str]:
    """The sentences (and lines) of `text`, stripped, empty ones left out; curly apostrophes straightened."""
    return [s.strip() for s in _SENTENCE.split(text.replace("\u2019", "'")) if s.strip()]


def is_repetitive(text: str, min_unique: float = 0.5, min_words: int = 30) -> bool:
    """Fewer than `min_unique` of the response's word 3-grams are distinct (responses of >= `min_words` words)."""
    words = _WORD.findall(text.lower())
    if len(words) < min_words:
        return False
    grams = list(zip(words, words[1:], words[2:]))
    return len(set(grams)) / len(grams) < min_unique


def is_broken(text: str, min_alnum_share: float = 0.3) -> bool:
    """Empty, no letter or digit, a decoding failure or control character, or mostly symbols."""
    visible = [c for c in text if not c.isspace()]
    if not visible or _CONTROL.search(text):
        return True
    alnum = sum(c.isalnum() for c in visible)
    return alnum == 0 or alnum / len(visible) < min_alnum_share


def _offers_after(rest: str, min_chars: int) -> bool:
    """`rest` (what follows a refusal or a disclaimer), courtesy and lecture sentences left out, offers help of
    another kind in at least `min_chars` characters."""
    found = [s.lstrip(",;: ") for s in sentences(rest)]
    kept = [s for s in found if not _COURTESY.search(s) and (_REFERRAL.search(s) or not _LECTURE.search(s))]
    return sum(len(s) for s in kept) >= min_chars and any(_OFFER.search(s) or _REFERRAL.search(s) for s in kept)


def refusal(text: str, min_alternative_chars: int = 40) -> str | None:
    """`plain` or `alternative` for a response whose first sentence declines the request, None for any other."""
    found = sentences(text)
    if not found:
        return None
    first = found[0]
    match = _DECLINE.search(first)
    if match is None:
        return None
    rest = text.replace("\u2019", "'")
    rest = rest[rest.find(first) + match.end():]
    return "alternative" if _offers_after(rest, min_alternative_chars) else "plain"


def is_greeting_only(text: str) -> bool:
    """Every clause is a greeting or a pleasantry."""
    clauses = [c.strip() for c in _CLAUSE.split(text.replace("\u2019", "'")) if c.strip()]
    return bool(clauses) and all(_PLEASANTRY.match(c) for c in clauses)


def is_clarification_only(text: str, max_chars: int = 400) -> bool:
    """Short, no list, asks the user for more, and says nothing else (see the module docstring)."""
    if len(text.strip()) > max_chars or _LIST.search(text):
        return False
    asked = False
    for s in sentences(text):
        if _COURTESY.search(s) or is_greeting_only(s) or _APOLOGY.match(s):
            continue
        # A question counts when it addresses the user, or follows one that did (`For example, what is ...?`).
        if (s.endswith("?") and (asked or _YOU.search(s) is not None)) or _ASKS.search(s):
            asked = True
        else:
            return False
    return asked


def is_boilerplate(text: str, min_alternative_chars: int = 40) -> bool:
    """Opens with an AI disclaimer and offers nothing after it."""
    found = sentences(text)
    if not found or _DISCLAIMER.match(found[0]) is None:
        return False
    rest = text.replace("\u2019", "'")
    rest = rest[rest.find(found[0]) + _DISCLAIMER.match(found[0]).end():]
    return not _offers_after(rest, min_alternative_chars)


def classify(text: str, *, min_alnum_share: float = 0.3, min_alternative_chars: int = 40,
             max_clarification_chars: int = 400) -> Kind:
    """The response's kind (see the module docstring); the first that applies, in `Kind`'s order."""
    if is_broken(text, min_alnum_share):
        return Kind.BROKEN
    if is_greeting_only(text):
        return Kind.GREETING_ONLY
    if is_clarification_only(text, max_clarification_chars):
        return Kind.CLARIFICATION_ONLY
    declined = refusal(text, min_alternative_chars)
    if declined == "plain":
        return Kind.PLAIN_REFUSAL
    if declined is None and is_boilerplate(text, min_alternative_chars):
        return Kind.BOILERPLATE
    return Kind.OK
