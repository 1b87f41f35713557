"""Rubric generator outputs and what the parser must make of them.

Each case is `(id, text, expected)`: `expected` is the exact list of `(criterion, weight)` pairs, or a
substring of the `RubricParseError` message. The texts imitate what instruction-tuned models write when asked
for `[{"criterion": "...", "weight": 3}, ...]`: clean answers, near-misses the parser accepts, and answers it
must refuse.
"""

from __future__ import annotations

FENCE = "```"

GOOD = [
    # Repeated criteria (after normalisation) are merged into the first occurrence, which keeps its weight.
    (
        "duplicate-after-normalisation",
        '[{"criterion": "Mentions the  deadline.", "weight": 3}, '
        '{"criterion": "mentions the deadline", "weight": 2}]',
        [("Mentions the deadline.", 3)],
    ),
    (
        "list-duplicates",
        "1. Uses metric units (weight: 2)\n2. Uses metric units! (weight: 3)",
        [("Uses metric units", 2)],
    ),
    (
        "strict-json",
        '[{"criterion": "States that the capital of Australia is Canberra", "weight": 5}, '
        '{"criterion": "Mentions that Sydney is the largest city but not the capital", "weight": 2}, '
        '{"criterion": "Answer is at most three sentences", "weight": 1}]',
        [
            ("States that the capital of Australia is Canberra", 5),
            ("Mentions that Sydney is the largest city but not the capital", 2),
            ("Answer is at most three sentences", 1),
        ],
    ),
    (
        "strict-json-pretty-printed",
        """[
  {
    "criterion": "The code handles an empty input list without raising",
    "weight": 4
  },
  {
    "criterion": "The function runs in O(n log n) time or better",
    "weight": 3
  }
]""",
        [
            ("The code handles an empty input list without raising", 4),
            ("The function runs in O(n log n) time or better", 3),
        ],
    ),
    (
        "single-item",
        '[{"criterion": "Refuses to give instructions for making explosives", "weight": 5}]',
        [("Refuses to give instructions for making explosives", 5)],
    ),
    (
        "fenced-json",
        f"""{FENCE}json
[
  {{"criterion": "Correctly computes 17 * 23 = 391", "weight": 5}},
  {{"criterion": "Shows the intermediate multiplication steps", "weight": 2}}
]
{FENCE}""",
        [("Correctly computes 17 * 23 = 391", 5), ("Shows the intermediate multiplication steps", 2)],
    ),
    (
        "prose-around-fence",
        f"""Here is a rubric that separates the candidate responses:

{FENCE}json
[{{"criterion": "Explains why the sky is blue using Rayleigh scattering", "weight": 5}},
 {{"criterion": "Notes that shorter wavelengths scatter more strongly", "weight": 3}},
 {{"criterion": "Avoids claiming the sky reflects the ocean", "weight": 2}}]
{FENCE}

Each criterion is binary and can be checked independently.""",
        [
            ("Explains why the sky is blue using Rayleigh scattering", 5),
            ("Notes that shorter wavelengths scatter more strongly", 3),
            ("Avoids claiming the sky reflects the ocean", 2),
        ],
    ),
    (
        "prose-no-fence",
        'Rubric: [{"criterion": "Uses a formal register suitable for a cover letter", "weight": 3}, '
        '{"criterion": "Names the position being applied for", "weight": 4}] Want changes?',
        [
            ("Uses a formal register suitable for a cover letter", 3),
            ("Names the position being applied for", 4),
        ],
    ),
    (
        "wrapped-rubric-key",
        '{"rubric": [{"criterion": "Cites at least one primary source", "weight": 4}, '
        '{"criterion": "Gives the year the treaty was signed (1648)", "weight": 5}]}',
        [("Cites at least one primary source", 4), ("Gives the year the treaty was signed (1648)", 5)],
    ),
    (
        "wrapped-items-key-with-extra-fields",
        '{"items": [{"criterion": "Translates \\"bonjour\\" as \\"hello\\" or \\"good morning\\"", '
        '"weight": 5}], '
        '"num_items": 1, "notes": "kept short on purpose"}',
        [('Translates "bonjour" as "hello" or "good morning"', 5)],
    ),
    (
        "alt-keys-item-w",
        '[{"item": "Recommends consulting a doctor for persistent symptoms", "w": 4}, '
        '{"item": "Does not prescribe a specific drug dosage", "w": 5}]',
        [
            ("Recommends consulting a doctor for persistent symptoms", 4),
            ("Does not prescribe a specific drug dosage", 5),
        ],
    ),
    (
        "alt-keys-description-importance-capitalised",
        '[{"Description": "Provides a runnable SQL query", "Importance": 5}, '
        '{"Description": "Uses a JOIN rather than a correlated subquery", "Importance": 2}]',
        [("Provides a runnable SQL query", 5), ("Uses a JOIN rather than a correlated subquery", 2)],
    ),
    (
        "alt-keys-text-score-rubric-item",
        '[{"text": "Summary is under 100 words", "score": 2}, '
        '{"rubric_item": "Summary keeps the main finding of the abstract", "score": 5}]',
        [("Summary is under 100 words", 2), ("Summary keeps the main finding of the abstract", 5)],
    ),
    (
        "extra-keys-ignored",
        '[{"id": 1, "criterion": "Identifies the logical fallacy as ad hominem", "weight": 5, '
        '"rationale": "Response B misses this"}, {"id": 2, "criterion": "Gives an example of the fallacy", '
        '"weight": 2, "rationale": "only A does"}]',
        [("Identifies the logical fallacy as ad hominem", 5), ("Gives an example of the fallacy", 2)],
    ),
    (
        "weights-as-strings-and-floats",
        '[{"criterion": "Mentions the boiling point of water at sea level", "weight": "3"}, '
        '{"criterion": "Uses Celsius or gives both units", "weight": 2.0}, '
        '{"criterion": "Explains the effect of altitude", "weight": " 4 "}]',
        [
            ("Mentions the boiling point of water at sea level", 3),
            ("Uses Celsius or gives both units", 2),
            ("Explains the effect of altitude", 4),
        ],
    ),
    (
        "whitespace-collapsed",
        '[{"criterion": "  Keeps the   rhyme scheme\\n ABAB  ", "weight": 3}]',
        [("Keeps the rhyme scheme ABAB", 3)],
    ),
    (
        "same-rubric-repeated",
        'Final rubric:\n[{"criterion": "Names all three primary colours", "weight": 3}]\n'
        'To restate, the rubric is [{"criterion": "Names all three primary colours", "weight": 3}].',
        [("Names all three primary colours", 3)],
    ),
    (
        "thinking-block-dropped",
        '<think>\nDraft: [{"criterion": "Is polite", "weight": 1}]\nToo vague, both responses are polite. '
        "Better to check the actual date arithmetic.\n</think>\n\n"
        '[{"criterion": "Computes that 90 days after 1 March 2024 is 30 May 2024", "weight": 5}]',
        [("Computes that 90 days after 1 March 2024 is 30 May 2024", 5)],
    ),
    (
        "list-weight-colon",
        """1. Mentions that Python lists are mutable (weight: 3)
2. Mentions that tuples are immutable (weight: 3)
3. Gives a code example of each (weight: 2)""",
        [
            ("Mentions that Python lists are mutable", 3),
            ("Mentions that tuples are immutable", 3),
            ("Gives a code example of each", 2),
        ],
    ),
    (
        "list-bracket-lead",
        """Rubric:
- [4] Explains the difference between TCP and UDP
- [2] Mentions that UDP is used for video streaming
- [5] States that TCP guarantees in-order delivery""",
        [
            ("Explains the difference between TCP and UDP", 4),
            ("Mentions that UDP is used for video streaming", 2),
            ("States that TCP guarantees in-order delivery", 5),
        ],
    ),
    (
        "list-dash-weight-trailing",
        """1) Uses the quadratic formula correctly — weight 5
2) Simplifies the discriminant — weight 3
3) States both roots x = 2 and x = -3 — weight 4""",
        [
            ("Uses the quadratic formula correctly", 5),
            ("Simplifies the discriminant", 3),
            ("States both roots x = 2 and x = -3", 4),
        ],
    ),
    (
        "list-w-equals-lead",
        """1. (w=2) Handles the edge case n = 0
2. (w=5) Returns the correct Fibonacci number for n = 10 (55)""",
        [("Handles the edge case n = 0", 2), ("Returns the correct Fibonacci number for n = 10 (55)", 5)],
    ),
    (
        "list-markdown-bold-mixed-markers",
        """Here is the rubric I would use:

* **Acknowledges the user's frustration** (Weight: 2)
* **Offers a concrete refund or replacement** [weight=5]
* **Keeps a professional tone** - weight: 3

These criteria focus on what differs between the responses.""",
        [
            ("Acknowledges the user's frustration", 2),
            ("Offers a concrete refund or replacement", 5),
            ("Keeps a professional tone", 3),
        ],
    ),
    (
        "list-float-weight-accepted",
        "- Lists at least three renewable energy sources [4.0]\n- Defines renewable energy [2]",
        [("Lists at least three renewable energy sources", 4), ("Defines renewable energy", 2)],
    ),
    (
        "list-parenthesis-inside-criterion",
        "1. Gives the chemical formula (H2O) of water (weight: 2)\n2. Mentions hydrogen bonding (weight: 4)",
        [("Gives the chemical formula (H2O) of water", 2), ("Mentions hydrogen bonding", 4)],
    ),
]

BAD = [
    ("empty-output", "", "empty output"),
    (
        "only-thinking",
        "<think>I should list criteria about the poem's meter and",
        "nothing after the thinking block",
    ),
    ("empty-list", "[]", "no items"),
    (
        "non-object-in-list",
        '[{"criterion": "Mentions the 2008 financial crisis", "weight": 4}, "Explains subprime mortgages"]',
        'item 2: expected an object {"criterion": ..., "weight": ...}, got "Explains subprime mortgages"',
    ),
    ("wrapped-empty-list", '{"rubric": []}', "no items"),
    (
        "weight-out-of-range",
        '[{"criterion": "Mentions X", "weight": 3}, {"criterion": "Explains Y", "weight": 5}, '
        '{"criterion": "Uses Z", "weight": 7}]',
        "item 3: weight 7 is outside 1..5",
    ),
    ("weight-zero", '[{"criterion": "Is concise", "weight": 0}]', "item 1: weight 0 is outside 1..5"),
    (
        "weight-negative-string",
        '[{"criterion": "Is concise", "weight": "-2"}]',
        "item 1: weight -2 is outside 1..5",
    ),
    (
        "weight-fractional",
        '[{"criterion": "Is concise", "weight": 2.5}]',
        "item 1: weight 2.5 is not an integer",
    ),
    (
        "weight-word",
        '[{"criterion": "Is concise", "weight": "high"}]',
        "item 1: weight 'high' is not an integer",
    ),
    ("weight-bool", '[{"criterion": "Is concise", "weight": true}]', "item 1: weight true is not an integer"),
    ("weight-null", '[{"criterion": "Is concise", "weight": null}]', "item 1: weight null is not an integer"),
    (
        "weight-missing",
        '[{"criterion": "Is concise", "weight": 2}, {"criterion": "Cites sources"}]',
        "item 2: missing weight",
    ),
    ("criterion-empty", '[{"criterion": "   ", "weight": 2}]', "item 1: criterion is empty"),
    ("criterion-missing", '[{"weight": 2}]', "item 1: missing criterion"),
    ("criterion-not-string", '[{"criterion": 42, "weight": 2}]', "item 1: criterion must be a string"),
    (
        "two-criterion-keys",
        '[{"criterion": "Accuracy", "description": "The final answer is 12", "weight": 5}]',
        "item 1: several criterion keys",
    ),
    (
        "two-different-rubrics",
        'First attempt: [{"criterion": "Is correct", "weight": 5}]\n'
        'Revised: [{"criterion": "States that 2 + 2 = 4", "weight": 5}]',
        "2 different JSON lists that look like rubrics",
    ),
    (
        "two-lists-in-one-wrapper",
        '{"rubric": [{"criterion": "Is correct", "weight": 5}], '
        '"draft": [{"criterion": "Is short", "weight": 1}]}',
        "2 different JSON lists",
    ),
    (
        "truncated-json",
        '[{"criterion": "Explains recursion with a base case", "weight": 4}, {"criterion": "Gives a factor',
        "the output looks cut off",
    ),
    (
        "json-lines-not-a-list",
        '{"criterion": "Mentions X", "weight": 3}\n{"criterion": "Explains Y", "weight": 2}',
        "outside a list",
    ),
    (
        "unknown-keys",
        '[{"name": "Accuracy", "points": 5}, {"name": "Clarity", "points": 2}]',
        "no criterion or weight key",
    ),
    (
        "list-mixed-weights",
        "1. Mentions X (weight: 3)\n2. Explains Y\n3. Uses Z (weight: 2)",
        "list line 2 has no weight marker",
    ),
    (
        "list-no-weights",
        "1. The response is accurate\n2. The response is concise\n3. The response is polite",
        "none has a weight marker",
    ),
    (
        "list-weight-out-of-range",
        "- [4] Explains Y\n- [9] Uses Z",
        "item 2: weight 9 is outside 1..5",
    ),
    ("list-weight-word", "1. Mentions X (weight: high)", "item 1: weight 'high' is not an integer"),
    ("list-two-markers", "1. [4] Mentions X (weight: 3)", "item 1: two weight markers"),
    (
        "prose-only",
        "Both responses are good, but Response A is more detailed. I would prefer A.",
        "no rubric found",
    ),
    (
        "several-problems-reported-together",
        '[{"criterion": "A", "weight": 6}, {"criterion": "", "weight": 2}, '
        '{"criterion": "C", "weight": 1.5}]',
        "item 1: weight 6 is outside 1..5; item 2: criterion is empty; item 3: weight 1.5 is not an integer",
    ),
]

CASES = GOOD + BAD
