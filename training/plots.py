"""Figures of a training run, from its `train_log.jsonl` (no model is loaded): matplotlib draws them off screen.

- `plot_run(DIR)` -> `DIR/training_curves.png`: one small panel per logged curve the run has, against the step:
  TRL's reward (the policy's: its generator's is 0 on average by construction), the reward's components
  (`dr/disc_mean`, `dr/anchor_mean`, `dr/anchor_pair_acc`, `dr/reward_mean`), the rubric parse rate, the zero-spread groups, the loss, and the held-out numbers
  (`eval_dr/...`, drawn with markers). Written at the end of every run and by `harness train plot DIR`.
- `plot_learning(summary, PATH)`: a learning comparison (`training.learning`): per arm (trained, shuffled,
  base weights) the held-out score, the mean over seeds with the band from the lowest to the highest seed, and per
  seed the paired difference of the gains with its bootstrap interval.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.errors import TOO_DEEP, ConfigError

CURVES: tuple[tuple[str, str], ...] = (
    ("reward", "reward (TRL)"),
    ("dr/reward_mean", "reward mean"),
    ("dr/disc_mean", "discriminability"),
    ("dr/anchor_mean", "anchor reward"),
    ("dr/anchor_pair_acc", "anchor pairs in annotated order"),
    ("dr/parse_rate", "rubric parse rate"),
    ("dr/zero_std_groups", "groups with zero spread"),
    ("loss", "loss"),
    ("eval_dr/disc_mean", "held-out discriminability"),
    ("eval_dr/anchor_pair_acc", "held-out anchor pairs in order"),
    ("eval_dr/reward_mean", "held-out reward mean"),
    ("eval_dr/parse_rate", "held-out parse rate"),
    ("eval_seen/dr/reward_mean", "training prompts' reward mean (evaluated)"),
)
"""Log key -> panel title, in panel order; a run draws the keys its log has."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError('drawing the training curves needs matplotlib: pip install -e ".[verifiable]"') from None
    return plt


def read_log(path: Path) -> list[dict[str, Any]]:
    """The lines of a `train_log.jsonl`: each a JSON object with its integer `step`, as `training.fit` writes them.

    Raises:
        ConfigError: when it is missing or unreadable, or a line is not UTF-8, not JSON, not an object or has no
            integer step (naming the file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no training log (train_log.jsonl) there")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    lines = []
    for n, raw in enumerate(data.splitlines(), start=1):
        where = f"{path}:{n}"
        try:
            line = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: not UTF-8 text") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: invalid JSON ({exc})") from None
        except RecursionError:
            raise ConfigError(f"{where}: {TOO_DEEP}") from None
        if not isinstance(line, dict):
            raise ConfigError(f"{where}: a log line is a JSON object, not {json.dumps(line)[:60]}")
        step = line.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"{where}: a log line holds its step, an integer >= 0 (found {step!r})")
        lines.append(line)
    return lines


def series(lines: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one key over the log lines that hold a number for it."""
    steps, values = [], []
    for line in lines:
        value = line.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            steps.append(line["step"])
            values.append(float(value))
    return steps, values


def plot_run(out: Path) -> Path:
    """Draw `out/train_log.jsonl`'s curves into `out/training_curves.png`; returns its path.

    Raises:
        ConfigError: for a missing or malformed log, a log with no curve, or matplotlib missing.
    """
    out = Path(out)
    lines = read_log(out / "train_log.jsonl")
    # The generator's reward is a sum of group-standardised components: 0 on average by construction.
    flat = {"reward", "dr/reward_mean", "eval_dr/reward_mean"} if _kind(out) == "generator" else set()
    found = [(key, title, *series(lines, key)) for key, title in CURVES if key not in flat]
    found = [f for f in found if f[2]]
    if not found:
        raise ConfigError(f"{out / 'train_log.jsonl'}: no curve to draw (none of {', '.join(k for k, _ in CURVES)})")
    plt = _pyplot()
    cols = min(3, len(found))
    rows = (len(found) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.0 * cols, 2.6 * rows), squeeze=False)
    for ax, (key, title, steps, values) in zip(axes.flat, found):
        held_out = key.startswith("eval_")
        ax.plot(steps, values, marker="o" if held_out or len(steps) < 12 else None, markersize=3,
                color="tab:orange" if held_out else "tab:blue")
        ax.set_title(f"{title}\n{key}", fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(found):]:
        ax.axis("off")
    fig.suptitle(str(out), fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, out / "training_curves.png")


def _kind(out: Path) -> str | None:
    """The run's kind from its manifest (None when it has none)."""
    try:
        return json.loads((out / "dr_manifest.json").read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def plot_learning(summary: Mapping[str, Any], path: Path) -> Path:
    """Draw a learning comparison (`training.learning.summarise`): the held-out score per arm (trained, shuffled,
    base weights), the mean over seeds with a min-max band; and per seed the paired difference of the gains with
    its 95% bootstrap interval against 0. Returns `path`.

    Raises:
        ConfigError: when matplotlib is missing.
    """
    plt = _pyplot()
    fig, (curves, paired) = plt.subplots(1, 2, figsize=(10.0, 3.4), squeeze=True)
    colors = {"trained": "tab:blue", "shuffled": "tab:orange", "base": "tab:gray"}
    for arm, curve in summary["curves"].items():
        steps = curve["steps"]
        curves.plot(steps, curve["mean"], marker="o", markersize=3, color=colors.get(arm, "black"),
                    label=f"{arm} ({len(curve['seeds'])} seeds)")
        curves.fill_between(steps, curve["min"], curve["max"], color=colors.get(arm, "black"), alpha=0.2)
    curves.set_title("held-out score (mean over prompts)", fontsize=9)
    curves.set_xlabel("step", fontsize=8)
    curves.grid(alpha=0.3)
    curves.legend(fontsize=7)
    shown = [(seed, p) for seed, p in summary["paired"].items() if "low" in p]
    for x, (seed, p) in enumerate(shown):
        paired.errorbar([x], [p["mean"]], yerr=[[p["mean"] - p["low"]], [p["high"] - p["mean"]]], fmt="o",
                        color="tab:blue", capsize=4)
    paired.axhline(0.0, color="black", linewidth=0.8)
    paired.set_xticks(range(len(shown)), [f"seed {seed}" for seed, _ in shown])
    paired.set_xlim(-0.5, max(len(shown), 1) - 0.5)
    paired.set_title("gain - shuffled gain, 95% paired bootstrap", fontsize=9)
    paired.grid(alpha=0.3)
    fig.suptitle(summary.get("title", ""), fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, Path(path))


def _save(fig: Any, plt: Any, path: Path) -> Path:
    from harness.runstore import write_error

    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        plt.close(fig)
    return path
