"""Start real vLLM 0.32 with each of several argument lists and report how it fails.

Usage: ``python vllm_cli.py SPEC.json OUT.json``. SPEC is ``{"model": DIR, "cases": {name:
[arg, ...]}, "parse": {name: [arg, ...]}, "fields": [...]}``.

``flags``: every option string of the API server's parser (``make_arg_parser``, which includes
``EngineArgs.add_cli_args``).

``parse``: each argument list parsed by that parser, then ``EngineArgs.from_cli_args``; the
values of ``fields`` (EngineArgs attribute names) are reported, or the parser's exit code and
message.

``cases``: arguments of ``vllm serve`` (no model; ``--load-format dummy --enforce-eager`` are
added), each started until it fails. For each case, in this one process (vLLM is imported
once):

1. the API server's own parser (``make_arg_parser``) parses the arguments; an argparse error
   is what the server exits 2 with (its ``usage:`` and ``error:`` lines are captured);
2. the engine configuration is built (``AsyncEngineArgs.from_cli_args(...)
   .create_engine_config()``): a validation error here is what the server exits 1 with, and the
   last line(s) of its traceback are ``traceback.format_exception_only`` of it;
3. otherwise the engine starts in process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and steps
   once: an error (e.g. too little KV cache for ``max_model_len``) is again exit 1.

OUT is ``{"flags": [...], "parse": {name: ...}, "cases": {name: {"rc": 0|1|2, "message":
text}}}``. Spawned by the tests so pytest's own
process never imports vLLM.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import sys
import traceback


def main(cases_path: str, out_path: str) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with open(cases_path, encoding="utf-8") as f:
        spec = json.load(f)

    from vllm import LLMEngine
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    flags = sorted({o for a in make_arg_parser(FlexibleArgumentParser())._actions
                    for o in a.option_strings})
    parsed: dict[str, dict[str, object]] = {}
    for name, argv in spec.get("parse", {}).items():
        parser = make_arg_parser(FlexibleArgumentParser(prog="api_server.py"))
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(["--model", spec["model"], *argv])
        except SystemExit as e:
            parsed[name] = {"rc": int(e.code or 0), "message": err.getvalue()}
            continue
        args = EngineArgs.from_cli_args(ns)
        parsed[name] = {"rc": 0, "values": {f: getattr(args, f) for f in spec["fields"]}}
    out: dict[str, dict[str, object]] = {}
    for name, argv in spec.get("cases", {}).items():
        full = ["--model", spec["model"], "--load-format", "dummy", "--enforce-eager", *argv]
        parser = make_arg_parser(FlexibleArgumentParser(prog="api_server.py"))
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(full)
        except SystemExit as e:
            out[name] = {"rc": int(e.code or 0), "message": err.getvalue()}
            continue
        try:
            AsyncEngineArgs.from_cli_args(ns).create_engine_config()
        except Exception as e:
            out[name] = {"rc": 1, "message": "".join(traceback.format_exception_only(e))}
            continue
        engine = None
        try:
            engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(ns))
        except Exception as e:
            out[name] = {"rc": 1, "message": "".join(traceback.format_exception_only(e))}
        else:
            out[name] = {"rc": 0, "message": ""}
        finally:
            if engine is not None:
                engine.engine_core.shutdown()
            del engine
            gc.collect()
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"flags": flags, "parse": parsed, "cases": out}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
