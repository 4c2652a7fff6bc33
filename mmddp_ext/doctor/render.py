"""The terminal report: rich tables, written through MMEngine's logger."""
import io
from typing import List

from mmengine.logging import print_log

from .report import BLOCKER, DOCTOR_ERROR, OK, WARN, DoctorReport

STYLE = {OK: 'green', WARN: 'yellow', BLOCKER: 'bold red',
         DOCTOR_ERROR: 'bold magenta'}
WIDTH = 110
TRACEBACK_LINES = 16


def progress(step: int, total: int, text: str) -> None:
    """One progress line per phase."""
    print_log(f'ddp_doctor [{step}/{total}] {text}', logger='current')


def _console():
    from rich.console import Console
    return Console(file=io.StringIO(), width=WIDTH, force_terminal=False,
                   color_system=None, highlight=False)


def _checks_table(report: DoctorReport):
    from rich.table import Table
    table = Table(title=f'DDP doctor: {report.config} on {report.nproc} '
                  f'ranks, {report.iters} iterations', show_lines=True)
    for column in ('phase', 'check', 'verdict', 'finding'):
        table.add_column(column, overflow='fold')
    for check in report.checks:
        table.add_row(check.phase, check.name,
                      f'[{STYLE[check.verdict]}]{check.verdict}[/]',
                      check.summary)
    return table


def _ranks_table(report: DoctorReport):
    from rich.table import Table
    table = Table(title='per rank and iteration')
    for column in ('iter', 'rank', 'batch', 'GT', 'loss keys',
                   'collectives', 'no grad', 'non-finite', 'step s',
                   'peak MiB'):
        table.add_column(column)
    ranks = report.dynamic['ranks']
    for k in range(min(len(r['iterations']) for r in ranks)):
        for rank, result in enumerate(ranks):
            rec = result['iterations'][k]
            table.add_row(
                str(k), str(rank), rec['kind'], str(rec['gt_boxes']),
                str(len(rec['loss_keys'])), str(len(rec['collectives'])),
                str(len(rec['no_grad'])),
                str(len(rec['nonfinite_losses']) +
                    len(rec['nonfinite_grads'])),
                f"{rec['step_time_s']:.2f}", f"{rec['peak_memory_mb']:.0f}")
    return table


def _gradients_table(report: DoctorReport):
    from rich.table import Table
    table = Table(title='gradient equivalence: N ranks vs one process')
    table.add_column('module')
    table.add_column('relative error')
    for module, error in report.gradient_equivalence[
            'relative_error'].items():
        table.add_row(module, f'{error:.2e}')
    return table


def _findings(report: DoctorReport) -> List[str]:
    lines = []
    for check in report.checks:
        if check.verdict == OK:
            continue
        lines.append(f'{check.verdict.upper()} {check.phase}/{check.name}: '
                     f'{check.summary}')
        if check.on_gpus:
            lines.append(f'  on {report.nproc} GPUs: {check.on_gpus}')
        for fix in check.fix:
            lines.append(f'  paste: {fix}')
        traceback = check.details.get('traceback')
        if traceback:
            tail = traceback.rstrip().splitlines()[-TRACEBACK_LINES:]
            lines.append(f'  traceback (last {len(tail)} lines):')
            lines.extend(f'    {line}' for line in tail)
    return lines


def render(report: DoctorReport) -> str:
    """The whole report as plain text (tables and findings)."""
    console = _console()
    console.print(_checks_table(report))
    if report.dynamic and report.dynamic.get('ranks'):
        console.print(_ranks_table(report))
    if report.gradient_equivalence and report.gradient_equivalence.get(
            'relative_error'):
        console.print(_gradients_table(report))
    text = console.file.getvalue()
    findings = _findings(report)
    verdict = (f'verdict: {report.verdict.upper()} '
               f'(exit code {report.exit_code})')
    return '\n'.join([text.rstrip()] + findings + [_timing(report), verdict])


def _timing(report: DoctorReport) -> str:
    """Wall time, and the CPU time of this process and of each rank (on a
    shared machine the CPU time says what a quiet one would take)."""
    t = report.timings
    ranks = ', '.join(f'{s:.0f}' for s in t.get('rank_cpu_s', []))
    return (f"time: {t.get('total_s', 0):.0f} s wall; CPU "
            f"{t.get('main_cpu_s', 0):.0f} s in this process" +
            (f', {ranks} s in the ranks' if ranks else ''))


def log_report(report: DoctorReport) -> None:
    print_log('\n' + render(report), logger='current')
