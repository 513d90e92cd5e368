"""A small reader of the Dockerfile and .dockerignore, enough for static checks without a
Docker engine: instructions per stage (continuations joined, ARG defaults substituted) and
Docker's .dockerignore matching (Go filepath.Match patterns plus ``**``, ``!`` re-includes,
last match wins, a matched directory excludes what is under it)."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str
    args: str

    def words(self) -> list[str]:
        """The arguments split like a shell would (flags such as ``--chown=`` included)."""
        return shlex.split(self.args)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for i in self.all("ENV"):
            for word in i.words():
                key, _, value = word.partition("=")
                out[key] = value
        return out


def instructions(text: str) -> list[Instruction]:
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comments inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    out = []
    for line in lines:
        keyword, _, args = line.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    return out


def stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages (FROM bases with those ARGs substituted)."""
    args: dict[str, str] = {}
    out: list[Stage] = []
    for i in instructions(text):
        if i.keyword == "ARG" and not out:
            key, _, value = i.args.partition("=")
            args[key] = value
        elif i.keyword == "FROM":
            words = i.words()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                          lambda m: args.get(m.group(1) or m.group(2), ""), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            out.append(Stage(base, name))
        elif out:
            out[-1].instructions.append(i)
    return args, out


# ---- .dockerignore --------------------------------------------------------------------------


def _regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i:end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


@dataclass
class DockerIgnore:
    patterns: list[tuple[bool, re.Pattern[str], str]]

    @classmethod
    def parse(cls, text: str) -> DockerIgnore:
        out = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            out.append((negate, _regex(pattern), pattern))
        return cls(out)

    def ignored(self, path: str) -> bool:
        """Whether the context path (posix, relative) is left out of the build context."""
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        result = False
        for negate, regex, _ in self.patterns:
            if any(regex.fullmatch(p) for p in prefixes):
                result = not negate
        return result

    def context(self, root: Path) -> list[str]:
        """Every file (and symlink) of ``root`` that the build context holds."""
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root):
            rel = Path(dirpath).relative_to(root).as_posix()
            rel = "" if rel == "." else rel + "/"
            keep = []
            for d in dirnames:
                path = rel + d
                if os.path.islink(root / path):
                    filenames.append(d)
                elif not self.ignored(path) or self._may_reinclude(path):
                    keep.append(d)
            dirnames[:] = keep
            out.extend(rel + f for f in filenames if not self.ignored(rel + f))
        return sorted(out)

    def _may_reinclude(self, directory: str) -> bool:
        return any(negate and (raw.startswith(directory + "/") or "*" in raw.split("/")[0])
                   for negate, _, raw in self.patterns)
