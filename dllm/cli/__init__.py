"""The `dllm` command: `dllm generate`, `dllm bench`, `dllm sweep`, `dllm train`,
`dllm train-filter`, `dllm token-frequencies`, `dllm samplers`, `dllm serve`. Each command's options and action live in its own module;
the options several commands share are defined once in `options`."""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from . import bench, frequencies, generate, samplers, serve, sweep, train
from .options import parse_kv

__all__ = ["build_parser", "main", "parse_kv"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dllm", description="Run masked-diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    generate.add_parser(sub)
    bench.add_parser(sub)
    train.add_parsers(sub)
    frequencies.add_parser(sub)
    sweep.add_parser(sub)
    samplers.add_parser(sub)
    serve.add_parser(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning as the command shows it: `warning: <message>`, without the source line."""
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shown_as = warnings.formatwarning
    warnings.formatwarning = _one_line_warning
    try:
        return args.func(args)
    except SystemExit as err:    # a bad option value found while reading it (`--sampler-arg tau`): a usage error
        if isinstance(err.code, str):
            print(err.code, file=sys.stderr)
            return 2
        raise
    except BrokenPipeError:      # the reader of stdout stopped early (`dllm samplers | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        return 1
    finally:
        warnings.formatwarning = shown_as
