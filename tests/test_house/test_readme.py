"""README.md stays a front door: short, the two commands first, and every
link it gives to a file or a section of one leads somewhere."""
import os.path as osp
import re
from typing import List, Set

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
README = osp.join(REPO_ROOT, 'README.md')
# At most 250 lines (issue 44): the README says what the package is, gives
# the demo and test commands and the opt-in; measured figures, the model-zoo
# matrix and each component's details live in docs/ and are linked from it.
README_MAX_LINES = 250
FIRST_COMMANDS = ('bash tools/demo.sh', 'bash tools/run_tests.sh')
LINK = re.compile(r'\]\(([^)\s]+)\)')
FENCE = re.compile(r'^\s*```')
HEADING = re.compile(r'^#{1,6} (.+)$')


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def heading_anchors(markdown: str) -> Set[str]:
    """The anchors GitHub gives the headings of ``markdown`` (lower case,
    punctuation but ``-`` and ``_`` dropped, spaces as ``-``); lines inside
    code blocks are not headings."""
    anchors, in_code = set(), False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        match = None if in_code else HEADING.match(line)
        if match:
            text = re.sub(r'[^\w\- ]', '', match.group(1).strip().lower())
            anchors.add(text.replace(' ', '-'))
    return anchors


def broken_links(markdown: str, root: str = REPO_ROOT) -> List[str]:
    """The relative links of ``markdown`` whose file is missing, or whose
    ``#anchor`` names no heading of that file."""
    broken = []
    for target in LINK.findall(markdown):
        if re.match(r'[a-z]+://', target):
            continue
        path, _, anchor = target.partition('#')
        full = osp.join(root, path)
        if not osp.exists(full):
            broken.append(target)
        elif anchor and anchor not in heading_anchors(_read(full)):
            broken.append(target)
    return broken


def test_readme_is_at_most_250_lines():
    count = len(_read(README).splitlines())
    assert count <= README_MAX_LINES, (
        f'README.md has {count} lines, more than {README_MAX_LINES}: move '
        'figures or details into docs/ and link them from the README.')


def test_readme_starts_with_the_demo_and_test_commands():
    first_block = _read(README).split('```')[1].splitlines()[1:]
    commands = tuple(line.split('#')[0].strip() for line in first_block)
    assert commands == FIRST_COMMANDS
    for command in commands:
        assert osp.isfile(osp.join(REPO_ROOT, command.split()[-1]))


def test_every_readme_link_leads_somewhere():
    assert broken_links(_read(README)) == []


def test_the_link_check_finds_a_missing_file_and_section():
    """The checker's own control: a renamed file or heading is caught."""
    text = ('[a](docs/design.md#autoddp) [b](docs/design.md#no-such-part) '
            '[c](docs/no_such_file.md) [d](https://example.org/x)')
    assert broken_links(text) == [
        'docs/design.md#no-such-part', 'docs/no_such_file.md'
    ]
