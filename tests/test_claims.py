"""docs/claims.md stays current: every test it names exists, every row
names one, and every README heading is covered."""
import ast
import os.path as osp
import re
from functools import lru_cache

import pytest

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CLAIMS = osp.join(REPO_ROOT, 'docs', 'claims.md')
README = osp.join(REPO_ROOT, 'README.md')
NODE_ID = re.compile(r'`(tests/[\w/.-]+\.py(?:::[\w.\[\]-]+)+)`')
COLUMNS = ('Section', 'Claim', 'Test', 'Negative control')
NO_SECTION_CLAIMS = 'Sections without claims of their own:'


def _cells(line):
    """Cells of a markdown table row (``|`` inside backticks kept)."""
    cells, current, in_code = [], '', False
    for char in line.strip()[1:]:
        if char == '`':
            in_code = not in_code
        if char == '|' and not in_code:
            cells.append(current.strip())
            current = ''
        else:
            current += char
    return cells


def claim_rows(text):
    """``(line number, {column: cell})`` of every row of the claims table."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines)
                  if line.startswith('|') and 'Claim' in line)
    assert tuple(_cells(lines[header])) == COLUMNS, lines[header]
    rows = []
    for number, line in enumerate(lines[header + 2:], header + 3):
        if not line.startswith('|'):
            break
        cells = _cells(line)
        assert len(cells) == len(COLUMNS), f'line {number}: {line}'
        rows.append((number, dict(zip(COLUMNS, cells))))
    return rows


def _normalise(heading):
    return re.sub(r'\s+', ' ', heading.replace('`', '')).strip().lower()


@lru_cache(maxsize=None)
def _definitions(path):
    """Names defined at module level and in classes: {'f', 'C::m'}."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(f'{node.name}::{item.name}' for item in node.body
                         if isinstance(item, (ast.FunctionDef,
                                              ast.AsyncFunctionDef)))
    return names


def missing_node_ids(node_ids, root=REPO_ROOT):
    """The ids among ``node_ids`` whose file or test does not exist."""
    missing = []
    for node_id in node_ids:
        path, *names = node_id.split('::')
        full = osp.join(root, path)
        name = '::'.join(re.sub(r'\[.*\]$', '', n) for n in names)
        if (not osp.isfile(full) or not osp.basename(path).startswith('test_')
                or not name.split('::')[-1].startswith('test')
                or name not in _definitions(full)):
            missing.append(node_id)
    return missing


def _read(path):
    with open(path) as f:
        return f.read()


def test_every_named_test_exists():
    ids = NODE_ID.findall(_read(CLAIMS))
    assert len(ids) > 50
    assert missing_node_ids(ids) == []


def test_every_row_names_a_test_and_a_control_or_says_why():
    for number, row in claim_rows(_read(CLAIMS)):
        assert row['Claim'], number
        assert NODE_ID.search(row['Test']) or row['Test'].startswith(
            'untested:'), f'line {number}: no test for {row["Claim"]!r}'
        control = row['Negative control']
        assert NODE_ID.search(control) or control.startswith('n/a:'), (
            f'line {number}: no negative control and no reason')


def test_every_readme_heading_is_covered():
    claims = _read(CLAIMS)
    sections = {_normalise(row['Section']) for _, row in claim_rows(claims)}
    exempt_line = next(line for line in claims.splitlines()
                       if line.startswith(NO_SECTION_CLAIMS))
    exempt = _normalise(exempt_line)
    headings = re.findall(r'^#{2,3} (.+)$', _read(README), re.M)
    uncovered = [
        h for h in headings
        if _normalise(h) not in sections and _normalise(h) not in exempt
    ]
    assert uncovered == []


@pytest.mark.parametrize('node_id, exists', [
    ('tests/test_claims.py::test_every_named_test_exists', True),
    ('tests/test_claims.py::test_every_named_test_exists[param]', True),
    ('tests/test_claims.py::test_no_such_test', False),
    ('tests/test_no_such_file.py::test_x', False),
    ('tests/test_claims.py::missing_node_ids', False),  # not a test
])
def test_checker_tells_existing_from_missing_ids(node_id, exists):
    """The checker's own control: a renamed or deleted test is caught."""
    assert (missing_node_ids([node_id]) == []) is exists
