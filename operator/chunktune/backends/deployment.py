"""A Deployment's engine flags, read and set in one place: which container
(:func:`engine_container`: by name, or the first), where its flags are (:func:`flags_field`:
its ``args``, or a one-string shell command such as ``["sh", "-c", "vllm serve M
--max_num_batched_tokens 1024"]``, told apart by :func:`is_shell_string`), their values
(:func:`read_flags`) and the list with new values (:func:`set_flags`). Pure: the operator
reads the Deployment (the re-tune's running configuration, :mod:`chunktune.k8s.retuner`) and
patches it (``spec.output.patchDeployment``, :mod:`chunktune.k8s.outputs`) with these."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from chunktune.core.flags import FLAGS, Flag, coerce_point, expand, parse_argv

#: An argument that holds a shell command line: whitespace, then an option.
_SHELL = re.compile(r"\s--?\w")


def is_shell_string(arg: str) -> bool:
    """Whether ``arg`` is a command line in one string (flags inside it, split by a shell)."""
    return _SHELL.search(arg) is not None


def engine_container(deploy: Mapping[str, Any], name: str | None) -> Mapping[str, Any] | None:
    """The Deployment's container ``name`` (the first when None); None when not there."""
    containers = (((deploy.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers") or []
    if name:
        return next((c for c in containers if c.get("name") == name), None)
    return containers[0] if containers else None


def flags_field(container: Mapping[str, Any]) -> tuple[str, list[str]]:
    """Where the container's flags are set, and its value: ``args``, or ``command`` when there
    are no args and the command is a shell command line in one string."""
    args = [str(a) for a in container.get("args") or []]
    command = [str(c) for c in container.get("command") or []]
    if not args and any(is_shell_string(c) for c in command):
        return "command", command
    return "args", args


def read_flags(container: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The values of flags ``names`` the container sets (its args, else its command; a
    one-string shell command split as the shell would)."""
    args = [str(a) for a in container.get("args") or []] or \
        [str(c) for c in container.get("command") or []]
    tokens: list[str] = []
    for a in args:
        tokens += shlex.split(a) if is_shell_string(a) else [a]
    values = parse_argv(tokens).values
    return {k: v for k, v in values.items() if k in names}


def set_flags(args: Sequence[str], params: Mapping[str, Any]) -> list[str]:
    """``args`` with each flag of ``params`` set: an existing value replaced (``--flag V``,
    ``--flag=V``, either spelling ``--max-num-batched-tokens`` / ``--max_num_batched_tokens``,
    also inside a one-string shell command such as ``["vllm serve M --max_num_batched_tokens
    1024"]``), a missing flag appended (to that string when the args are one)."""
    out = list(args)
    shell = next((i for i, a in enumerate(out) if is_shell_string(a)), None)
    values = coerce_point(params)
    if any(FLAGS[name].within for name in values):  # a key inside a JSON flag's object
        inside = shlex.split(out[shell]) if shell is not None else out
        values = expand(values, inside)
    for name, value in values.items():
        flag = FLAGS[name]
        if value is None:  # num-speculative-tokens 0: speculative decoding off
            if shell is not None:
                raise ValueError(f"cannot drop {flag.option} from a one-string command; give "
                                 "the container's args as a list")
            out = _drop_flag(out, flag)
            continue
        if flag.kind == "bool":
            out = _set_switch(out, shell, flag, bool(value))
            continue
        text = flag.text(value)
        if shell is not None:
            out[shell] = _set_in_string(out[shell], flag, text)
            continue
        spellings = flag.spellings
        done = False
        i = 0
        while i < len(out):
            a = out[i]
            if a in spellings:
                if i + 1 < len(out):
                    out[i + 1] = text
                else:
                    out.append(text)
                done = True
                i += 2
                continue
            if a.split("=", 1)[0] in spellings and "=" in a:
                out[i] = f"{a.split('=', 1)[0]}={text}"
                done = True
            i += 1
        if not done:
            out += [flag.option, text]
    return out


def _drop_flag(args: list[str], flag: Flag) -> list[str]:
    """``args`` without ``flag`` and its value (either form)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in flag.spellings:
            skip = True
            continue
        if "=" in a and a.split("=", 1)[0] in flag.spellings:
            continue
        out.append(a)
    return out


def _switch_spellings(flag: Flag) -> tuple[str, ...]:
    """Every spelling of a switch, on and off (``--async-scheduling``, ``--async_scheduling``,
    ``--no-async-scheduling``, ``--no_async_scheduling``)."""
    return (*flag.spellings, f"--no-{flag.name}", f"--no_{flag.attr}", f"--no-{flag.attr}")


def _set_switch(args: list[str], shell: int | None, flag: Flag, on: bool) -> list[str]:
    """``args`` with the switch set on or off: its first spelling, either form, replaced by
    the one ``on`` gives and any later ones dropped (vLLM's last one would win); appended
    where the switch is not given. Inside a one-string shell command too."""
    token = flag.format(on)[0]
    spellings = set(_switch_spellings(flag))
    if shell is not None:
        spell = "|".join(re.escape(s) for s in sorted(spellings, key=len, reverse=True))
        pattern = re.compile(rf"(?<!\S)({spell})(?!\S)")
        command = args[shell]
        found = list(pattern.finditer(command))
        if not found:
            command = f"{command.rstrip()} {token}"
        else:
            for m in reversed(found[1:]):  # later copies go, with the space before them
                command = command[:m.start()].rstrip() + command[m.end():]
            m = found[0]
            command = command[:m.start()] + token + command[m.end():]
        return [*args[:shell], command, *args[shell + 1:]]
    out: list[str] = []
    placed = False
    for a in args:
        if a in spellings:
            if not placed:
                out.append(token)
                placed = True
            continue
        out.append(a)
    if not placed:
        out.append(token)
    return out


def _set_in_string(command: str, flag: Flag, value: str) -> str:
    spell = "|".join(re.escape(s) for s in flag.spellings)
    pattern = re.compile(rf"(?<!\S)({spell})(=|\s+)(\"[^\"]*\"|'[^']*'|\S+)")
    if pattern.search(command):
        return pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}{shlex.quote(value)}", command)
    return f"{command.rstrip()} {flag.option} {shlex.quote(value)}"


__all__ = ["engine_container", "flags_field", "is_shell_string", "read_flags", "set_flags"]
