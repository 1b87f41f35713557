"""AlpacaEval 2's metrics over the judge's annotations, computed by the `alpaca-eval` package's own functions.

Upstream: `tatsu-lab/alpaca_eval` (Apache-2.0 code). One annotation per instruction: the reference output
(`output_1`, `gpt4_1106_preview`), the policy's output (`output_2`) and the judge's `preference` in [1, 2]
(1: the reference is better, 2: the policy is; continuous when read from the judge's logprobs, 1.5 a draw;
the judge is `judges.alpaca`).

- `alpaca_metrics`: `win_rate`, `standard_error`, `n_wins`, `n_wins_base`, `n_draws`, `n_total`,
  `discrete_win_rate` from `alpaca_eval.metrics.get_winrate`, and `avg_length` as the leaderboard prints it (the
  policy's mean output length in characters, truncated to an integer: `alpaca_eval.main.evaluate`).
- `length_controlled`: the length-controlled win rate of `alpaca_eval.metrics.get_length_controlled_winrate` with
  its `length_controlled_v1` GLM, which trains on per-instruction difficulties and the annotations of two gamed
  baselines that the package downloads from the Hub (`df_gamed.csv` in the dataset `tatsu-lab/alpaca_eval`).
  Offline that download fails, and this is a clear error: no other GLM is substituted (the `minimal` variant reads
  37.8 where the true LC is 19.3). A local copy of the file can be given instead (`gamed_csv`), which is also how
  the tests run the GLM. The GLM joins the annotations to the file by the instruction's position in the
  805-instruction set, so the annotations are first checked to hold exactly those 805 instructions, each once,
  their positions are taken from the reference order (never from the annotations' own order: alpaca_eval issue
  453), and they reach the GLM in that order (its cross-validation folds follow the row order).

`alpaca-eval` imports `pkg_resources`, which `setuptools>=81` removed: the `policy` extra pins `setuptools<81`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import BackendUnavailableError, ConfigError

LC_GLM = "length_controlled_v1"
"""The GLM of the published length-controlled win rate."""
GAMED_FILE = ("tatsu-lab/alpaca_eval", "df_gamed.csv")
"""(Hub dataset, file) the LC GLM downloads."""
_WINRATE_FIELDS = ("win_rate", "standard_error", "n_wins", "n_wins_base", "n_draws", "n_total", "discrete_win_rate")


def metrics_module() -> Any:
    """`alpaca_eval.metrics` (its LC GLM module loaded), or a clear error where the package is missing or broken."""
    try:
        import alpaca_eval.metrics as metrics
        import alpaca_eval.metrics.glm_winrate  # noqa: F401  (the LC GLM and its download seam)
    except ImportError as exc:
        hint = " (alpaca-eval needs setuptools<81)" if "pkg_resources" in str(exc) else ""
        raise BackendUnavailableError(
            f"AlpacaEval metrics need the alpaca-eval package{hint}: pip install 'dynamicrubric-harness[policy]' "
            f"({exc})"
        ) from None
    return metrics


def _annotation_frame(annotations: Sequence[Mapping[str, Any]]) -> Any:
    import pandas as pd

    needed = ("instruction", "output_1", "output_2", "generator_1", "generator_2", "preference")
    for i, row in enumerate(annotations):
        missing = [k for k in needed if k not in row]
        if missing:
            raise ConfigError(f"AlpacaEval annotation {i} lacks {', '.join(missing)}")
        p = row["preference"]
        if p is not None and not (isinstance(p, (int, float)) and (p == 0 or 1 <= p <= 2)):
            raise ConfigError(f"AlpacaEval annotation {i}: preference {p!r} is not in [1, 2] (or 0 for a draw)")
    frame = pd.DataFrame([{k: row[k] for k in needed} for row in annotations])
    frame["annotator"] = [row.get("annotator", "harness") for row in annotations]
    return frame


def alpaca_metrics(annotations: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Win rate (x100), its standard error, wins/draws and the discrete win rate (`get_winrate`), and
    `avg_length` (mean characters of `output_2`, truncated to an integer as the leaderboard prints it).

    A `preference` of None (a judgment that failed) counts in none of them, as in alpaca_eval.

    Raises:
        ConfigError: on an annotation without the fields or with a preference outside [1, 2].
    """
    if not annotations:
        raise ConfigError("no AlpacaEval annotations to score")
    frame = _annotation_frame(annotations)
    found = metrics_module().get_winrate(frame)
    out = {k: float(found[k]) for k in _WINRATE_FIELDS}
    out["avg_length"] = float(int(frame["output_2"].str.len().mean()))
    return out


def check_alignment(annotations: Sequence[Mapping[str, Any]], instructions: Sequence[str]) -> list[int]:
    """The position of each annotation's instruction in `instructions` (the dataset's order), after checking
    that the annotations hold every instruction exactly once (what the LC GLM's join assumes).

    Raises:
        ConfigError: naming the missing, repeated or unknown instructions.
    """
    position = {text: i for i, text in enumerate(instructions)}
    if len(position) != len(instructions):
        raise ConfigError("the AlpacaEval instruction list repeats an instruction")
    seen: dict[str, int] = {}
    unknown = []
    for row in annotations:
        text = row["instruction"]
        if text not in position:
            unknown.append(text)
        seen[text] = seen.get(text, 0) + 1
    repeated = [t for t, n in seen.items() if n > 1]
    missing = [t for t in instructions if t not in seen]
    if unknown or repeated or missing:
        def show(texts: list[str]) -> str:
            return ", ".join(repr(t[:40]) for t in texts[:3]) + (" ..." if len(texts) > 3 else "")

        problems = [f"{len(v)} {k} ({show(v)})" for k, v in
                    (("missing", missing), ("repeated", repeated), ("not in the set", unknown)) if v]
        raise ConfigError(
            f"AlpacaEval annotations must hold each of the {len(instructions)} instructions once for the "
            f"length-controlled win rate: {'; '.join(problems)}"
        )
    return [position[row["instruction"]] for row in annotations]


@contextlib.contextmanager
def _gamed_from(path: Path | None) -> Iterator[None]:
    """Within the block, the GLM's Hub download of `df_gamed.csv` returns `path` (when given)."""
    glm = metrics_module().glm_winrate
    if path is None:
        yield
        return
    if not Path(path).is_file():
        raise ConfigError(f"{path}: no such file (the AlpacaEval LC GLM's {GAMED_FILE[1]})")
    original = glm.hf_hub_download

    def local(*, repo_id: str, filename: str, **_: Any) -> str:
        if (repo_id, filename) != GAMED_FILE:
            raise ConfigError(f"the LC GLM asked for {repo_id}/{filename}; only {GAMED_FILE[1]} is given locally")
        return str(path)

    glm.hf_hub_download = local
    try:
        yield
    finally:
        glm.hf_hub_download = original


def length_controlled(
    annotations: Sequence[Mapping[str, Any]], instructions: Sequence[str], *, gamed_csv: Path | None = None
) -> dict[str, Any]:
    """The length-controlled win rate and its standard error (x100) by alpaca_eval's `length_controlled_v1` GLM,
    and the GLM's name (`glm`).

    Args:
        annotations: One per instruction (see `check_alignment`), with `output_1`, `output_2` and `preference`.
        instructions: The 805 instructions in the dataset's order (their positions join the GLM's data).
        gamed_csv: A local `df_gamed.csv`; None downloads it from the Hub.

    Raises:
        ConfigError: on misaligned annotations, or when `df_gamed.csv` cannot be had (offline), saying so.
    """
    metrics = metrics_module()
    positions = check_alignment(annotations, instructions)
    frame = _annotation_frame(annotations)
    frame["index"] = positions
    # In the dataset's order, as alpaca_eval's own pipeline passes them: the GLM's cross-validation folds follow
    # the row order, so another order gives another (slightly different) fit.
    frame = frame.sort_values("index", kind="stable").set_index("index", drop=False)
    frame.index.name = None
    try:
        with _gamed_from(gamed_csv):
            found = metrics.get_length_controlled_winrate(
                frame, glm_name=LC_GLM, save_weights_dir=None, is_warn_extreme_changes=False
            )
    except ConfigError:
        raise
    except Exception as exc:  # the Hub download, offline or refused
        if gamed_csv is None and _is_download_error(exc):
            raise ConfigError(
                f"the length-controlled win rate needs {GAMED_FILE[1]} from the Hugging Face dataset "
                f"{GAMED_FILE[0]} and it could not be downloaded ({type(exc).__name__}: {str(exc)[:160]}); "
                "go online once (it is cached) or pass a local copy; no other GLM is substituted"
            ) from None
        raise
    lc, se = float(found["length_controlled_winrate"]), float(found["lc_standard_error"])
    if not math.isfinite(lc):
        raise ConfigError("the length-controlled GLM returned no finite win rate")
    return {"length_controlled_winrate": lc, "lc_standard_error": se, "glm": LC_GLM}


def _is_download_error(exc: Exception) -> bool:
    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    hub = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "HfHubHTTPError", "ConnectError", "ConnectionError",
           "EntryNotFoundError", "RepositoryNotFoundError", "HTTPError", "ProxyError", "TimeoutError"}
    return bool(names & hub) or "huggingface" in str(exc).lower()
