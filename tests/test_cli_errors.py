"""Bad input to the command lines: one error line naming the flag or the name, the bad-input exit code
(2; the gate's and distinguish's 3, as 2 is the gate's INCONCLUSIVE), never a traceback, and no work
done first. In-process calls of each `main` (fast), a few real subprocesses, and a bounded fuzz of
every numeric flag at parse level."""

import math
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvjax import Noisy, block_pair, cli
from tvjax.pools import report
from tvjax.pools.analysis import __main__ as analysis
from tvjax.pools.synthetic import write_synthetic_pool

SCORERS = "['mu', 'pi']"  # the small pool's scorers, as the refusals list them


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """A small noisy block pool: 64 trajectories per side of length 16, R = 4 passes, a top-2 readout."""
    pi, mu = block_pair(seed=10, n=16, block_bits=4, alpha=0.3)
    path = tmp_path_factory.mktemp("pools") / "small"
    write_synthetic_pool(jax.random.key(0), path, pi, mu, Noisy(0.1), num_per_side=64, repeats=4, top_k=2)
    return str(path)


def error_line(err, prog):
    """The error: stderr is exactly one line, `PROG: error: ...`."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


def refused(main, argv, capsys, code=2):
    """Run main(argv) in-process: exit `code` (SystemExit or returned), stdout empty; the error line."""
    with pytest.raises(SystemExit) as exit_info:
        returned = main(argv)
        raise SystemExit(returned)
    assert exit_info.value.code == code
    out, err = capsys.readouterr()
    assert out == ""  # nothing ran: no table row, no verdict, no report
    return err


# python -m tvjax ---------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, names", [
    (["--eps", "1e-9"], ["--eps 1e-09 --delta 0.1: the exact row cannot run: ", "2147483647"]),
    (["--sigma", "1e6"], ["--eps 0.05 --delta 0.1 --sigma 1e+06: the noisy row cannot run: ", "2147483647"]),
    (["--eps", "1e-4"], ["--sigma 0.1: the noisy row cannot run: ", "2147483647"]),
])
def test_main_job_refuses_a_budget_past_int32_before_any_row(argv, names, capsys):
    line = error_line(refused(cli.main, argv, capsys), "tvjax")
    for name in names:
        assert name in line


@pytest.mark.parametrize("flag, value", [("--eps", "nan"), ("--eps", "inf"), ("--eps", "0"), ("--eps", "1"),
                                         ("--delta", "-0.1"), ("--delta", "1e400"), ("--sigma", "-inf"),
                                         ("--sigma", "NaN"), ("--seed", "-1"), ("--seed", "1.5"), ("--seed", str(2**63))])
def test_main_job_numbers(flag, value, capsys):
    assert f"argument {flag}: " in error_line(refused(cli.main, [flag, value], capsys), "tvjax")


# tvjax gate / distinguish (bad input exits 3) ---------------------------------------------------

@pytest.mark.parametrize("argv, names", [
    (["--json", "/nonexistent/dir/out.json"], ["argument --json", "/nonexistent/dir"]),
    (["--pair", "lm", "--model", "/nonexistent.gguf"], ["argument --model", "/nonexistent.gguf"]),
    (["--round-size", "0"], ["argument --round-size", "'0'"]),
    (["--budget", "nan"], ["argument --budget"]),
    (["--budget", "0"], ["argument --budget"]),
    (["--n", "-3"], ["argument --n"]),
    (["--sigma", "inf"], ["argument --sigma"]),
    (["--seed", "x"], ["argument --seed"]),
])
def test_gate_refuses_before_any_round(argv, names, capsys):
    line = error_line(refused(cli.main, ["gate", "--tau", "0.05", *argv], capsys, code=3), "tvjax gate")
    for name in names:
        assert name in line


def test_gate_json_is_a_file_in_an_existing_folder(tmp_path, capsys):
    line = error_line(refused(cli.main, ["gate", "--tau", "0.05", "--json", str(tmp_path)], capsys, code=3), "tvjax gate")
    assert "argument --json" in line and "is a folder" in line
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = error_line(refused(cli.main, ["gate", "--tau", "0.05", "--json", str(blocker / "out.json")], capsys, code=3),
                      "tvjax gate")
    assert "argument --json" in line and "is not a folder" in line


@pytest.mark.parametrize("argv, flag", [(["--num", "1"], "--num"), (["--requests-per-second", "0"], "--requests-per-second"),
                                        (["--temperature", "nan"], "--temperature"), (["--max-tokens", "0"], "--max-tokens"),
                                        (["--pi-extra", "[1]"], "--pi-extra"), (["--mu-extra", "{"], "--mu-extra"),
                                        (["--json", "/nonexistent/dir/out.json"], "--json")])
def test_distinguish_numbers_and_paths(argv, flag, capsys):
    base = ["distinguish", "--pi-url", "http://127.0.0.1:9", "--mu-url", "http://127.0.0.1:9"]
    assert f"argument {flag}: " in error_line(refused(cli.main, base + argv, capsys, code=3), "tvjax distinguish")


# python -m tvjax.pools.report --------------------------------------------------------------------

REPORT = "python -m tvjax.pools.report"


def test_report_refuses_unknown_compare_scorers_before_any_analysis(pool, tmp_path, capsys):
    out = tmp_path / "report"
    line = error_line(refused(report.main, [pool, "--out", str(out), "--compare", "a,b"], capsys), REPORT)
    assert "compare a,b" in line and "'a'" in line and "'b'" in line and SCORERS in line
    line = error_line(refused(report.main, [pool, "--out", str(out), "--compare", "pi,nope"], capsys), REPORT)
    assert "unknown: 'nope'" in line and SCORERS in line
    assert not out.exists()  # refused before the report's folder was made


@pytest.mark.parametrize("argv, flag", [
    (["--permutations", "-1"], "--permutations"), (["--permutations", "0"], "--permutations"),
    (["--pilot-size", "1"], "--pilot-size"), (["--num-pilots", "0"], "--num-pilots"), (["--seed", "-2"], "--seed"),
    (["--compare", "pi"], "--compare"), (["--compare", "pi,mu,pi"], "--compare"), (["--compare", ",mu"], "--compare"),
])
def test_report_numbers_and_pairs(pool, tmp_path, argv, flag, capsys):
    line = error_line(refused(report.main, [pool, "--out", str(tmp_path / "r"), *argv], capsys), REPORT)
    assert f"argument {flag}: " in line


def test_report_out_must_be_a_folder(pool, tmp_path, capsys):
    existing = tmp_path / "summary.md"
    existing.write_text("keep me")
    for out in (existing, existing / "report"):
        line = error_line(refused(report.main, [pool, "--out", str(out)], capsys), REPORT)
        assert "argument --out: " in line and str(existing) in line
    assert existing.read_text() == "keep me"


@pytest.mark.parametrize("inside", ["", "tokens", "new/folder"])
def test_report_never_writes_into_the_pool(pool, inside, capsys):
    out = f"{pool}/{inside}" if inside else pool
    line = error_line(refused(report.main, [pool, "--out", out], capsys), REPORT)
    assert "is inside the pool" in line
    assert not (Path(pool) / "new").exists() and not (Path(pool) / "summary.md").exists()


def test_report_of_a_missing_pool_is_one_line(tmp_path, capsys):
    line = error_line(refused(report.main, [str(tmp_path / "missing"), "--out", str(tmp_path / "r")], capsys), REPORT)
    assert "missing" in line


# python -m tvjax.pools.analysis ------------------------------------------------------------------

ANALYSIS = "python -m tvjax.pools.analysis"


@pytest.mark.parametrize("argv, names", [
    (["sigma", "--scorer", "nope"], ["unknown scorer 'nope'", SCORERS]),
    (["support", "--scorer", "nope"], ["unknown scorer 'nope'", SCORERS]),
    (["tv", "--pair", "pi,nope"], ["unknown: 'nope'", SCORERS]),
    (["prefix", "--pair", "nope,mu"], ["unknown: 'nope'", SCORERS]),
    (["repeats", "--pair", "a,b"], ["unknown: 'a', 'b'", SCORERS]),
    (["multilevel", "--pair", "pi,nope"], ["unknown: 'nope'", SCORERS]),
    (["compare", "--against", "nope,mu"], ["unknown: 'nope'", SCORERS]),
    (["tv", "--repeats", "5"], ["repeats must be in [1, 4]"]),
])
def test_analysis_names_unknown_scorers_and_out_of_range_counts(pool, argv, names, capsys):
    line = error_line(refused(analysis.main, [argv[0], pool, *argv[1:]], capsys), ANALYSIS)
    for name in names:
        assert name in line


@pytest.mark.parametrize("argv, flag", [
    (["tv", "--repeats", "0"], "--repeats"), (["tv", "--permutations", "0"], "--permutations"),
    (["multilevel", "--pilot-size", "1"], "--pilot-size"), (["multilevel", "--num-pilots", "-5"], "--num-pilots"),
    (["tv", "--seed", "-1"], "--seed"), (["tv", "--pair", "pi"], "--pair"), (["compare", "--against", "a,b,c"], "--against"),
])
def test_analysis_numbers_and_pairs(pool, argv, flag, capsys):
    line = error_line(refused(analysis.main, [argv[0], pool, *argv[1:]], capsys), ANALYSIS)
    assert f"argument {flag}: " in line


def test_analysis_compare_needs_against(pool, capsys):
    assert "--against" in error_line(refused(analysis.main, ["compare", pool], capsys), ANALYSIS)


# real processes: the exit code and stderr a shell sees ------------------------------------------

@pytest.mark.parametrize("argv, code, prog, name", [
    (["tvjax", "--eps", "1e-9"], 2, "tvjax", "--eps"),
    (["tvjax", "gate", "--tau", "0.05", "--json", "/nonexistent/dir/out.json"], 3, "tvjax gate", "--json"),
    (["tvjax.pools.analysis", "sigma", "POOL", "--scorer", "nope"], 2, ANALYSIS, "'nope'"),
])
def test_a_real_process_prints_one_line_and_no_traceback(pool, argv, code, prog, name):
    argv = [pool if a == "POOL" else a for a in argv]
    done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert done.stdout == ""
    assert name in error_line(done.stderr, prog)


# fuzz: every numeric flag of every command line, at parse level ---------------------------------

def _in(low, high, *, low_open=True, high_open=True, integral=False):
    """What a correct parser makes of a flag's text: Python's int (or finite float) of it when that is
    in the range, else None (refused)."""
    def expected(text):
        try:
            value = int(text) if integral else float(text)
        except ValueError:
            return None
        above = low is None or (value > low if low_open else value >= low)
        below = high is None or (value < high if high_open else value <= high)
        return value if math.isfinite(value) and above and below else None
    return expected


PROBABILITY, POSITIVE, NONNEGATIVE = _in(0, 1), _in(0, None), _in(0, None, low_open=False)
COUNT, AT_LEAST_2 = _in(1, None, low_open=False, integral=True), _in(2, None, low_open=False, integral=True)
SEED = _in(0, 2**63 - 1, low_open=False, high_open=False, integral=True)

# (parser factory, prog, usage exit code, arguments that make the rest valid, {flag: accepted values})
PARSERS = [
    (cli.main_parser, "tvjax", 2, [], {"--eps": PROBABILITY, "--delta": PROBABILITY, "--sigma": NONNEGATIVE,
                                        "--seed": SEED}),
    (cli.gate_parser, "tvjax gate", 3, ["--tau", "0.5"],
     {"--tau": PROBABILITY, "--delta": PROBABILITY, "--budget": POSITIVE, "--sigma": NONNEGATIVE,
      "--round-size": COUNT, "--seed": SEED, "--n": COUNT}),
    (cli.distinguish_parser, "tvjax distinguish", 3, ["--pi-url", "u", "--mu-url", "u"],
     {"--num": AT_LEAST_2, "--max-tokens": COUNT, "--temperature": NONNEGATIVE, "--delta": PROBABILITY,
      "--seed": SEED, "--requests-per-second": POSITIVE}),
    (report.build_parser, REPORT, 2, ["POOL", "--out", "OUT"],
     {"--permutations": COUNT, "--pilot-size": AT_LEAST_2, "--num-pilots": COUNT, "--seed": SEED}),
    (analysis.build_parser, ANALYSIS, 2, ["tv", "POOL"],
     {"--repeats": COUNT, "--permutations": COUNT, "--pilot-size": AT_LEAST_2, "--num-pilots": COUNT, "--seed": SEED}),
]
CASES = [(factory, prog, code, base, flag, ok) for factory, prog, code, base, flags in PARSERS for flag, ok in flags.items()]

ODD = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e-400", "0", "-0", "0.0", "1", "1.0", "-1",
       "2", "0.5", "1e3", "1_000", "0x10", " 3", "3 ", "", " ", "--", "-x", "1,5", "١", "²", str(2**63), str(2**63 - 1),
       "9" * 5000]
VALUES = st.one_of(st.sampled_from(ODD), st.integers(-(2**70), 2**70).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=6))


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES), value=VALUES)
def test_fuzz_numeric_flags(case, value, tmp_path_factory, capsys):
    """Any text for any numeric flag: parsed to the value it means when in range, else the usage exit
    with one line naming the flag; never another exception."""
    factory, prog, code, base, flag, expected = case
    folder = tmp_path_factory.getbasetemp()
    base = [str(folder / "out") if a == "OUT" else str(folder) if a == "POOL" else a for a in base]
    capsys.readouterr()
    try:
        args = factory().parse_args([*base, f"{flag}={value}"])
    except SystemExit as exit_info:
        assert exit_info.code == code
        assert f"argument {flag}: " in error_line(capsys.readouterr().err, prog)
        assert expected(value) is None, f"{flag}={value!r} was refused but means {expected(value)!r}"
        return
    parsed = getattr(args, flag.lstrip("-").replace("-", "_"))
    assert parsed is not None and parsed == expected(value) and type(parsed) is type(expected(value)), (flag, value, parsed)


NAMES = st.one_of(st.sampled_from(["pi", "mu", "nope", "", "PI"]), st.text(max_size=4))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["tv", "prefix", "sigma"]), repeats=st.integers(-3, 7), a=NAMES, b=NAMES)
def test_fuzz_analysis_runs(pool, command, repeats, a, b, capsys):
    """Whole runs on the small pool with odd repeat counts and scorer names: JSON, or the usage exit /
    the returned 2 with one error line; never another exception."""
    capsys.readouterr()
    names = ["--scorer", a] if command == "sigma" else [f"--pair={a},{b}"]
    try:
        code = analysis.main([command, pool, f"--repeats={repeats}", "--permutations=2", *names])
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    if code == 0:
        assert out and not err
    else:
        assert code == 2 and out == ""
        error_line(err, ANALYSIS)


@pytest.mark.parametrize("factory, prog, code, base, flag", [(f, p, c, b, next(iter(flags))) for f, p, c, b, flags in PARSERS])
def test_a_dash_dash_value_is_a_missing_value(factory, prog, code, base, flag, tmp_path, capsys):
    """argparse drops a `--` value and sets a one-value option to [] unparsed: refused, naming the flag."""
    base = [str(tmp_path / "out") if a == "OUT" else str(tmp_path) if a == "POOL" else a for a in base]
    with pytest.raises(SystemExit) as exit_info:
        factory().parse_args([*base, f"{flag}=--"])
    assert exit_info.value.code == code
    assert f"argument {flag}: expected a value, got '--'" in error_line(capsys.readouterr().err, prog)
