"""The figures benchmarks/onnx_vs_pytorch.py prints, from made-up
latencies (the benchmark itself times full-size models and is not run in
CI)."""
import os.path as osp

import pytest

from ..helpers import REPO_ROOT

# ms per image, two rounds of three images: the medians over every call
# are 200 and 125 ms, the per-round ratios 100 / 200 and 300 / 200.
PYTORCH = [[0.1, 0.2, 0.3], [0.2, 0.2, 0.2]]
ORT = [[0.05, 0.1, 0.15], [0.1, 0.3, 0.3]]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'benchmarks'))
    import onnx_vs_pytorch
    return onnx_vs_pytorch


def test_summary_is_medians_ranges_and_ratios(bench):
    found = bench.summarize(dict(pytorch=PYTORCH, ort=ORT))
    assert found == pytest.approx(
        dict(
            pytorch_median=0.2,
            pytorch_min=0.1,
            pytorch_max=0.3,
            ort_median=0.125,
            ort_min=0.05,
            ort_max=0.3,
            ratio=0.625,
            round_ratio=1.0,
            round_ratio_min=0.5,
            round_ratio_max=1.5,
            rounds=2))


def test_report_prints_each_side_and_the_ratio(bench, capsys):
    bench.report('dfine_n (dfine_hgnetv2_n_coco.py)', (640, 640), 3,
                 bench.summarize(dict(pytorch=PYTORCH, ort=ORT)), 12.34,
                 2.4e-7)
    assert capsys.readouterr().out.splitlines() == [
        'dfine_n (dfine_hgnetv2_n_coco.py) (640x640, batch 1, 3 images x 2 '
        'rounds; export 12.3 s; max |sorted score diff| 2.4e-07)',
        '  PyTorch  median    200.0 ms  range 100.0-300.0 ms',
        '  ORT      median    125.0 ms  range 50.0-300.0 ms',
        '  ORT/PyTorch 0.625 (per-round ratios: median 1.000, range '
        '0.500-1.500)',
    ]
