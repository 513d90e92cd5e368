"""The commands a docs page tells a user to type: each ```bash block of the page, one command a
line (comments dropped), with what the page says the command does when it is meant to fail
(``# fails: MESSAGE``)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Command:
    """One command of a page: its text, its words and, for one the page says fails, the
    message the page quotes."""

    text: str
    words: tuple[str, ...]
    fails_with: str | None

    @property
    def program(self) -> str:
        return self.words[0]


def commands(page: str | Path) -> list[Command]:
    """Every command of the page's ``bash`` blocks, in order."""
    text = Path(page).read_text() if isinstance(page, Path) else (DOCS / page).read_text()
    out: list[Command] = []
    for block in _BLOCK.findall(text):
        for line in block.splitlines():
            line, _, comment = line.partition("  #") if "  #" in line else (line, "", "")
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            comment = comment.strip()
            fails = comment.split("fails:", 1)[1].strip() if comment.startswith(
                "fails:") else None
            out.append(Command(line, tuple(shlex.split(line)), fails))
    return out


def flag_values(words: tuple[str, ...], flag: str) -> list[str]:
    """The values given to ``flag`` (``--set a=b --set c=d`` -> ``["a=b", "c=d"]``)."""
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == flag]
