"""The README's main job: the table of the default estimate on the paper's instance."""

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
    for _, result in rows:
        assert float(result.ci_low) <= float(result.value) <= float(result.ci_high)
        assert abs(float(result.value) - truth) < 0.3
