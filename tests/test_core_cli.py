"""The README's main job: the table of the default estimate on the paper's instance."""

from statistics import NormalDist

import pytest

from tvjax import cli


def test_main_job_table(capsys):
    lines = []
    truth, rows = cli.run(eps=0.3, delta=0.3, sigma=0.1, emit=lines.append)
    assert truth == 0.3883154296875
    assert [access for access, _ in rows] == ["exact", "noisy", "sampler"]
    text = "\n".join(lines)
    assert "true TV = 0.3883154297" in text
    for label in ("exact logits", "noisy logits, sigma=0.1", "sample-only"):
        assert label in text
    z = NormalDist().inv_cdf(1 - 0.3 / 2)
    for _, result in rows:
        # The interval is the estimate +- (z stderr + top-level bias), clipped to [0, 1].
        half = z * float(result.stderr) + float(result.bias)
        assert float(result.ci_low) == pytest.approx(max(0.0, float(result.value) - half), abs=1e-6)
        assert float(result.ci_high) == pytest.approx(min(1.0, float(result.value) + half), abs=1e-6)
        assert abs(float(result.value) - truth) < 0.3


@pytest.mark.parametrize("argv", [["--eps", "2"], ["--eps", "nan"], ["--delta", "0"], ["--sigma", "-1"], ["--eps", "x"]])
def test_bad_options_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and argv[0] in err
    assert err.startswith("tvjax: error: ") and err.strip().endswith("(see tvjax --help)")
