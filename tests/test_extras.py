"""The core runs alone and every optional feature names its extra: `python -m tvjax` with every
optional package hidden, and each feature's one-line error when its package is missing. (CI also
runs the README's first command in a fresh bare venv: scripts/readme_first_command.sh.)"""

import subprocess
import sys

import pytest

from tvjax._extras import INSTALL, MissingExtra, require

OPTIONAL = ("zarr", "matplotlib", "flax", "optax", "gguf", "safetensors", "tokenizers", "jinja2", "hydra",
            "omegaconf", "tqdm", "httpx", "torch", "transformers", "vllm", "sglang")

HIDE = """
import importlib.abc, runpy, sys
class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Hidden())
sys.argv = ["tvjax", *{argv!r}]
{run}
"""


def run_hidden(hidden, argv=(), run='runpy.run_module("tvjax", run_name="__main__")'):
    code = HIDE.format(hidden=set(hidden), argv=list(argv), run=run)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"TVJAX_COMPILATION_CACHE": "off", "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})


def test_the_main_job_runs_without_any_optional_package():
    done = run_hidden(OPTIONAL, ["--eps", "0.1"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("true TV = 0.388315")
    assert [line.split()[0] for line in lines[-3:]] == ["exact", "noisy", "sample-only"]


@pytest.mark.parametrize("hidden, argv, extra", [
    ("zarr", ["gate", "--tau", "0.5"], "pools"),
    ("flax", ["distinguish", "--pi-url", "http://127.0.0.1:9", "--mu-url", "http://127.0.0.1:9"], "models"),
    ("httpx", ["distinguish", "--pi-url", "http://127.0.0.1:9", "--mu-url", "http://127.0.0.1:9"], "endpoints"),
])
def test_a_subcommand_without_its_extra_says_how_to_install_it(hidden, argv, extra):
    done = run_hidden([hidden], argv)
    assert done.returncode == 3, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"tvjax {argv[0]}: error: {hidden} is not installed, and ")
    assert line.endswith(f" need it: {INSTALL[extra]}")


@pytest.mark.parametrize("module, hidden, extra", [
    ("tvjax.pools.store", "zarr", "pools"), ("tvjax.models", "flax", "models"), ("tvjax.models", "jinja2", "models"),
    ("tvjax.audit.distinguish", "optax", "models"), ("tvjax.studykit", "hydra", "experiments"),
    ("tvjax.engines.openai_bridge", "httpx", "endpoints"), ("tvjax.engines.hf", "torch", "engines"),
])
def test_importing_a_feature_without_its_extra_raises_one_line(module, hidden, extra):
    run = f"""
try:
    import {module}
except ImportError as error:
    print(type(error).__name__, error, sep=": ")
"""
    done = run_hidden([hidden], run=run)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"MissingExtra: {hidden} is not installed, and ")
    assert done.stdout.rstrip().endswith(f"need it: {INSTALL[extra]}") and done.stdout.count("\n") == 1


def test_require_returns_the_module_and_keeps_other_import_errors(tmp_path, monkeypatch):
    assert require("json.decoder", "pools", "x").__name__ == "json.decoder"
    with pytest.raises(MissingExtra, match=r"^no_such_package is not installed, and tests need it: pip install 'tvjax\[plot\]'$"):
        require("no_such_package.sub", "plot", "tests")
    (tmp_path / "broken_pkg").mkdir()
    (tmp_path / "broken_pkg" / "__init__.py").write_text("import no_such_dependency_of_it\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_of_it"):  # installed but broken: its own error
        require("broken_pkg", "plot", "tests")
