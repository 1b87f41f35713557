"""Prompt templates: plain text files in `judges/prompts/`, loaded as package data and filled by name.

A template marks each slot as `{{name}}` (lower-case letters, digits, underscores). Rendering replaces every slot in
one pass over the *template*, so the inserted values (prompts and responses full of code, JSON or LaTeX braces, even
a literal `{{prompt}}`) are copied verbatim and never interpreted. Single braces in a template (a JSON example) are
plain text. `str.format` is never used: one `{` in a response would break it.
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources

__all__ = ["load_template", "render", "render_template", "response_label", "slots"]

_SLOT = re.compile(r"\{\{([a-z][a-z0-9_]*)\}\}")


@lru_cache(maxsize=None)
def load_template(name: str) -> str:
    """The text of `judges/prompts/<name>.txt`, without its final newline.

    Raises:
        FileNotFoundError: naming the template and the ones that exist.
    """
    # Anchored on the prompts package itself: `judges` can resolve as a namespace package when a test folder of
    # the same name is on sys.path, and namespace packages do not support `files()` reliably.
    folder = resources.files("judges.prompts")
    path = folder / f"{name}.txt"
    if not path.is_file():
        known = sorted(p.name.removesuffix(".txt") for p in folder.iterdir() if p.name.endswith(".txt"))
        raise FileNotFoundError(f"no prompt template {name!r}; known: {', '.join(known)}")
    return path.read_text(encoding="utf-8").rstrip("\n")


def slots(template: str) -> set[str]:
    """The slot names a template text uses."""
    return set(_SLOT.findall(template))


def render(template: str, **values: object) -> str:
    """Fill every `{{name}}` slot of `template` with `str(values[name])`.

    Raises:
        ValueError: a slot has no value, or a value has no slot (a typo either way would send a broken prompt).
    """
    needed = slots(template)
    missing = sorted(needed - set(values))
    unused = sorted(set(values) - needed)
    if missing or unused:
        raise ValueError(f"template slots missing values: {missing}; values without a slot: {unused}")
    text = {k: str(v) for k, v in values.items()}
    return _SLOT.sub(lambda m: text[m.group(1)], template)


def render_template(name: str, **values: object) -> str:
    """`render(load_template(name), **values)`."""
    return render(load_template(name), **values)


def response_label(index: int) -> str:
    """The label of the response shown at 0-based position `index`: A..Z, then AA, AB, ... (spreadsheet style)."""
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    label = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        label = chr(ord("A") + rem) + label
    return label
