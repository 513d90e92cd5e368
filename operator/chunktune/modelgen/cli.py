"""``chunktune model tiny DIR``: write a model directory real vLLM serves with no download."""

from __future__ import annotations

import argparse
import sys

from chunktune.modelgen.tiny import TINY, write_tiny_model


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    model = sub.add_parser("model", help="model directories that need no model hub")
    msub = model.add_subparsers(dest="model_cmd", required=True)
    tiny = msub.add_parser(
        "tiny",
        help="write a tiny Llama config.json and an offline-trained tokenizer into DIR",
        description="Write a tiny Llama (config.json, tokenizer.json, tokenizer_config.json) "
                    "into DIR. vLLM serves it with random weights: "
                    "`vllm serve DIR --load-format dummy`. Deterministic; no download.",
        allow_abbrev=False,
    )
    tiny.add_argument("directory", metavar="DIR", help="output directory (created if missing)")
    tiny.set_defaults(func=cmd_tiny)


def cmd_tiny(ns: argparse.Namespace) -> int:
    try:
        out = write_tiny_model(ns.directory)
    except OSError as e:
        print(f"error: cannot write the tiny model to {ns.directory}: {e}", file=sys.stderr)
        return 1
    s = TINY
    print(f"wrote {out}: Llama hidden {s.hidden_size}, {s.num_hidden_layers} layers, "
          f"vocab {s.vocab_size}, {s.max_position_embeddings} positions "
          f"(serve with --load-format dummy)")
    return 0
