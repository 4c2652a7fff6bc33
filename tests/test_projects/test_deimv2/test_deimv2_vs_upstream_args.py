"""benchmarks/deimv2_vs_upstream.py without an upstream checkout: how it
refuses a missing or wrong checkout and an unknown size, and the format
of its speed lines (the one tools/selftest.py reads from D-FINE's
benchmark). The benchmark itself needs upstream's code and is not run in
CI."""
import os.path as osp

import pytest

from .deimv2_utils import REPO_ROOT


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'benchmarks'))
    monkeypatch.delenv('DEIMV2_UPSTREAM', raising=False)
    import deimv2_vs_upstream
    return deimv2_vs_upstream


def _fake_checkout(root, sizes=('hgnetv2_n', )):
    (root / 'engine' / 'deim').mkdir(parents=True)
    (root / 'configs' / 'deimv2').mkdir(parents=True)
    for size in sizes:
        (root / 'configs' / 'deimv2' / f'deimv2_{size}_coco.yml').touch()
    return str(root)


def test_refuses_a_missing_or_wrong_checkout(bench, tmp_path, capsys):
    assert bench.main(['--sizes', 'hgnetv2_n', '--speed-sizes']) == 2
    err = capsys.readouterr().err
    assert 'No upstream checkout' in err and 'DEIMV2_UPSTREAM' in err
    assert bench.main([str(tmp_path), '--sizes', 'hgnetv2_n']) == 2
    assert 'is not a DEIMv2 checkout (no engine/deim in it)' in \
        capsys.readouterr().err
    # the environment variable is read the same way
    (tmp_path / 'engine').mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv('DEIMV2_UPSTREAM', str(tmp_path))
        with pytest.raises(ValueError, match='not a DEIMv2 checkout'):
            bench.upstream_root()


def test_accepts_a_checkout_and_names_the_sizes_it_has(bench, tmp_path,
                                                       capsys):
    root = _fake_checkout(tmp_path / 'up', ('hgnetv2_n', 'dinov3_s'))
    # control: a checkout with the size's YAML passes both checks
    assert bench.upstream_root(root) == root
    yml, port = bench.config_paths(root, 'hgnetv2_n')
    assert osp.isfile(yml) and osp.isfile(port)
    assert bench.main([root, '--sizes', 'hgnetv2_x', '--speed-sizes']) == 2
    err = capsys.readouterr().err
    assert 'deimv2_hgnetv2_x_coco.yml does not exist' in err
    assert 'sizes are dinov3_s, hgnetv2_n' in err
    with pytest.raises(SystemExit):
        bench.parse_args(['--rounds', '2'])
    assert '--rounds must be at least 3, got 2' in capsys.readouterr().err


def test_speed_lines_keep_the_format_the_selftest_reads(
        bench, capsys, monkeypatch):
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'tools'))
    import selftest
    figures = dict(
        port_cpu_s=0.2,
        upstream_cpu_s=0.25,
        cpu_ratio=0.8,
        cpu_ratio_min=0.75,
        cpu_ratio_max=0.9,
        rounds=5,
        threads=1,
        wall_ratio=0.82)
    bench.print_speed(
        dict(
            size='hgnetv2_n',
            speed=dict(
                inference=figures, train_step=dict(figures, cpu_ratio=1.05))))
    text = capsys.readouterr().out
    assert 'range 0.750-0.900' in text
    assert selftest.read_ratios(text) == dict(inference=0.8, train_step=1.05)
