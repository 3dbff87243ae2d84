"""The docs are true to the CLI (as sqlite-utils' tests/test_docs.py does): every command has help text, a section
in a guide page (docs/) and a row in the README's command table; the generated CLI reference (docs/cli.md) is
what tools/cli_reference.py prints, whatever the terminal; the README stays short and gives exactly the two
commands; every link between the README and the pages resolves, anchors included."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from qconsist.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ROOT / "docs"
REFERENCE = DOCS / "cli.md"
# The hand-written pages: every one but the generated reference.
GUIDE = {path.name: path.read_text(encoding="utf-8") for path in sorted(DOCS.glob("*.md")) if path != REFERENCE}


def _commands() -> list[tuple[str, ...]]:
    root = typer.main.get_command(app)
    found: list[tuple[str, ...]] = []

    def walk(cmd, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, path + (name,))
        else:
            found.append(path)

    walk(root, ())
    return found


COMMANDS = _commands()


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_there_are_commands():
    names = {" ".join(c) for c in COMMANDS}
    assert {"pipeline run", "calib repeat", "run", "diff", "locate", "models fetch"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_command_has_help_and_is_documented(path):
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    assert (command.help or "").strip(), f"qconsist {' '.join(path)} has no help text"
    name = " ".join(path)
    heading = re.compile(r"^#+ .*`qconsist " + re.escape(name) + r"[ `]", re.MULTILINE)
    assert any(heading.search(text) for text in GUIDE.values()), f"no page of docs/ has a heading for `qconsist {name}`"
    # the README's command table, first column: `qconsist runs list`, `runs show RUN`, ... name the group once
    firsts = [row.split(" | ")[0] for row in _section(README, "Commands").splitlines() if row.startswith("| `qconsist ")]
    assert any(f"`qconsist {name}" in cell or (cell.startswith(f"| `qconsist {path[0]} ") and f"`{name}" in cell)
               for cell in firsts), f"the README's command table has no row for `qconsist {name}`"
    assert f"## `qconsist {name}`" in REFERENCE.read_text(encoding="utf-8"), f"docs/cli.md lacks `qconsist {name}`: run make docs"


def test_the_cli_reference_is_current():
    """What the generator prints under a hostile terminal (narrow, colours forced) is the committed file."""
    env = {**os.environ, "COLUMNS": "37", "FORCE_COLOR": "1", "TERM": "xterm-256color", "TERMINAL_WIDTH": "50"}
    env.pop("NO_COLOR", None)
    printed = subprocess.run([sys.executable, str(ROOT / "tools" / "cli_reference.py"), "--stdout"], env=env,
                             capture_output=True, text=True, check=True, timeout=120).stdout
    assert "\x1b[" not in printed
    committed = REFERENCE.read_text(encoding="utf-8")
    assert printed == committed, "docs/cli.md is stale: run `make docs` and commit it"


def test_the_cli_reference_is_every_help_text():
    headings = re.findall(r"^## `qconsist ?(.*)`$", REFERENCE.read_text(encoding="utf-8"), re.MULTILINE)
    assert set(headings) >= {" ".join(c) for c in COMMANDS} | {"", "pipeline", "calib", "models", "runs"}
    assert "Usage: qconsist run [OPTIONS]" in REFERENCE.read_text(encoding="utf-8")


def test_readme_gives_the_two_commands():
    blocks = re.findall(r"```sh\n(.*?)```", _section(README, "The two commands"), re.S)
    typed = [line.split("#")[0].strip() for line in blocks[0].splitlines() if line.strip()]
    assert typed == ["make run", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_readme_is_short():
    assert len(README.splitlines()) <= 400


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    found, fence = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (match := re.match(r"^#+ (.*)", line)):
            found.add(_slug(match.group(1)))
    return found


def test_slug_is_githubs():
    assert _slug("`qconsist runs list`, `qconsist runs show RUN` and `qconsist runs rm [RUN…]`") == \
        "qconsist-runs-list-qconsist-runs-show-run-and-qconsist-runs-rm-run"
    assert _slug("`qconsist report ITEM… -o FILE.html`") == "qconsist-report-item--o-filehtml"


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{name}" for name in GUIDE)])
def test_links_resolve(page):
    path = ROOT / page
    text = path.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    if page == "README.md":  # the README leads to every page
        assert {f"docs/{name}" for name in GUIDE if name != "README.md"} | {"docs/cli.md"} <= {link.partition("#")[0] for link in links}
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.exists(), f"{page}: link {link} leads to no file"
        if anchor:
            assert anchor in _anchors(file.read_text(encoding="utf-8")), f"{page}: link {link}: no such heading"


def test_the_schema_table_is_the_codes():
    """docs/formats.md lists every schema the package declares, and no other."""
    code = set()
    for source in (ROOT / "qconsist").rglob("*.py"):
        code |= set(re.findall(r"[\"'](qconsist\.[a-z._-]+/\d+)[\"']", source.read_text(encoding="utf-8")))
    table = GUIDE["formats.md"].split("\n## Schemas\n", 1)[1]
    documented = set(re.findall(r"`(qconsist\.[a-z._-]+/\d+)`", table))
    documented |= {f"{name.rsplit('/', 1)[0]}/{old}" for name, old in re.findall(r"`(qconsist\.[a-z._-]+/\d+)` \(`/(\d+)` read\)", table)}
    assert len(code) >= 25
    assert code == documented, f"only in the code: {sorted(code - documented)}; only in docs/formats.md: {sorted(documented - code)}"


def test_the_exit_code_table_is_the_codes():
    """docs/trust.md's table has one row per exit code qconsist.errors defines."""
    from qconsist import errors

    codes = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    table = _section(GUIDE["trust.md"], "Exit codes")
    assert {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)} == codes == {0, 1, 2, 3, 4, 130}
