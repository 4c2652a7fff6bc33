"""The command line the checkpoint converters share
(``tools/convert_{rtdetr,dfine,deimv2}_checkpoint.py``): their common
arguments, the ``--to-upstream`` rule, and how a refused file ends (its
reason on stderr, exit code 1)."""
import argparse
import sys
from typing import Callable, Dict, List, Optional, Tuple

import torch.nn as nn
from mmengine.config import Config

from .checkpoint_conversion import (CheckpointConversionError, Log, StateDict,
                                    convert_file_to_upstream,
                                    load_upstream_checkpoint,
                                    save_converted_checkpoint)

# converter(cfg, model) -> (convert(state, log), further EMA fields or None)
UpstreamConverter = Callable[[Config, nn.Module],
                             Tuple[Callable[[StateDict, Log], StateDict],
                                   Optional[Dict]]]


def converter_arg_parser(description: str, src_help: str, dst_help: str,
                         config_help: str,
                         eval_size_help: str) -> argparse.ArgumentParser:
    """The arguments every converter takes: ``src``, ``dst``, ``--config``,
    ``--trust-pickle``, ``--to-upstream`` and ``--eval-size``; a tool adds
    its own before :func:`parse_converter_args`.

    Args:
        description (str): The tool's docstring (``--help`` prints it
            whole).
        src_help (str): What ``src`` may be.
        dst_help (str): What ``dst`` becomes.
        config_help (str): What ``--config`` checks.
        eval_size_help (str): What ``--eval-size`` sets with
            ``--to-upstream``.

    Returns:
        argparse.ArgumentParser: The parser.
    """
    parser = argparse.ArgumentParser(
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help=src_help)
    parser.add_argument('dst', help=dst_help)
    parser.add_argument('--config', help=config_help)
    parser.add_argument(
        '--trust-pickle',
        action='store_true',
        help='load the source with weights_only=False (only for files you '
        'trust, if the safe loader refuses it)')
    parser.add_argument(
        '--to-upstream',
        action='store_true',
        help="convert the other way: SRC is our checkpoint, DST upstream's "
        'layout (needs --config)')
    parser.add_argument(
        '--eval-size',
        type=int,
        nargs=2,
        metavar=('HEIGHT', 'WIDTH'),
        help=eval_size_help)
    return parser


def parse_converter_args(parser: argparse.ArgumentParser,
                         argv: Optional[List[str]] = None
                         ) -> argparse.Namespace:
    """Parse ``argv``; ``--to-upstream`` without ``--config`` is a usage
    error (the model the checkpoint was trained with gives the names and
    the anchors)."""
    args = parser.parse_args(argv)
    if args.to_upstream and not args.config:
        parser.error('--to-upstream needs --config: the model the '
                     'checkpoint was trained with')
    return args


def run_to_upstream(args: argparse.Namespace,
                    converter: UpstreamConverter) -> int:
    """``--to-upstream``: ``args.src`` (ours) written to ``args.dst`` in
    upstream's layout. Returns the exit code (1: refused, the reason on
    stderr)."""
    try:
        convert_file_to_upstream(args.src, args.dst, args.config, converter,
                                 args.trust_pickle)
    except CheckpointConversionError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


def run_from_upstream(
        args: argparse.Namespace,
        select_weights: Callable[[Dict], Tuple[StateDict, str]],
        convert: Callable[[StateDict, str], StateDict]) -> int:
    """Upstream's ``args.src`` converted for the port and saved to
    ``args.dst``. Returns the exit code (1: refused, the reason on stderr).

    Args:
        args (argparse.Namespace): Parsed by :func:`parse_converter_args`.
        select_weights (callable): Picks the weights of an upstream file:
            ``(state dict, where it was found)``.
        convert (callable): ``convert(upstream, source)``: the family's
            conversion, checked against ``args.config`` where given.
    """
    try:
        checkpoint = load_upstream_checkpoint(args.src, args.trust_pickle)
        upstream, source = select_weights(checkpoint)
        converted = convert(upstream, source)
    except CheckpointConversionError as error:
        print(error, file=sys.stderr)
        return 1
    save_converted_checkpoint(converted, args.dst, args.src, source, print)
    return 0
