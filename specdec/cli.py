"""Command line: `python -m specdec generate --prompt TEXT [...]`."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from specdec.bench import LONG_LENGTHS
from specdec.config import BANDIT_SCOPES, DEFAULT_ARMS, DEFAULT_SAMPLING_ARMS, METHODS, REWARDS, GenerationConfig
from specdec.models import DEFAULT_TARGET, ModelLoadError, Models
from specdec.passages import licence_prompts
from specdec.registry import KINDS, MODEL_KINDS
from specdec.records import RoundRecord, Summary

ARMS_HELP = f"bandit arms for *-ucb (default '{DEFAULT_ARMS}'; under sampling '{DEFAULT_SAMPLING_ARMS}')"

DEFAULT_BENCH_METHODS = "ar,mamba-ucb,mamba-chain,mamba-tree,tf-tree,lookup-chain,hf-ar,hf-assisted,hf-lookup"

DTYPE_HELP = ("target dtype: auto (bfloat16 on CUDA, and on a CPU with native bf16 whose bf16 matmuls are "
              "row-invariant and can be packed, where it is exact; else float32), float32, bfloat16 or float16")
MIN_BRANCH_Q_HELP = (f"greedy: drop a drafted node whose branch probability (the drafter's q along it) is below "
                     f"this; 0 with --min-expand-q 0 keeps whole shapes (default {GenerationConfig.min_branch_q})")
MIN_EXPAND_Q_HELP = (f"draft a node's children only from this branch probability (and --min-branch-q) on "
                     f"(default {GenerationConfig.min_expand_q})")
NO_GRAPHS_HELP = "on CUDA, step the Mamba drafter eagerly instead of replaying CUDA graphs (SPECDEC_CUDA_GRAPHS=0)"
DRAFTER_DTYPE_HELP = ("drafter dtype: auto (float32 on a CPU, else the target's), float32, "
                      "bfloat16 or float16")


def _add_generate(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="decode one prompt and print the text (or --json)")
    g.add_argument("--prompt", required=True, help="user message; wrapped in the target's chat template")
    g.add_argument("--method", default="mamba-ucb", choices=list(METHODS))
    g.add_argument("--target", default=DEFAULT_TARGET, help="preset, local folder, .gguf file or hub id")
    g.add_argument("--drafter", default=None, help="drafter model for the method (preset, folder or hub id)")
    g.add_argument("--tree", default=None, help="tree shape: a chain length like 4, or widths like 3,2,1")
    g.add_argument("--arms", default=None, help=ARMS_HELP)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--lambda-ucb", type=float, default=None,
                   help="the bandit's exploration weight (default: 0.1 with the pooled reward, 0.3 with the others)")
    g.add_argument("--lambda-gamma", type=float, default=0.1)
    g.add_argument("--reward", default="pooled", choices=REWARDS,
                   help="bandit reward for *-ucb: tokens/s predicted from acceptance pooled over the shapes "
                        "(pooled), measured per shape (throughput), or the paper's")
    g.add_argument("--lookup-branch", type=int, default=GenerationConfig.lookup_branch,
                   help="mamba-*/tf-*: also verify up to N tokens copied from the context (prompt lookup), "
                        "grafted onto each tree; 0 = off")
    g.add_argument("--min-branch-q", type=float, default=GenerationConfig.min_branch_q, help=MIN_BRANCH_Q_HELP)
    g.add_argument("--min-expand-q", type=float, default=GenerationConfig.min_expand_q, help=MIN_EXPAND_Q_HELP)
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or mps")
    g.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    g.add_argument("--drafter-dtype", default="auto", help=DRAFTER_DTYPE_HELP)
    g.add_argument("--no-cuda-graphs", action="store_true", help=NO_GRAPHS_HELP)
    g.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text, without the chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming the text")
    g.add_argument("--verbose", action="store_true", help="print one line per round to stderr")
    g.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from specdec.engine import generate  # heavy imports only when generating

    config = GenerationConfig(method=args.method, tree=args.tree, arms=args.arms, temperature=args.temperature,
                              top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
                              lambda_ucb=args.lambda_ucb, lambda_gamma=args.lambda_gamma, reward=args.reward,
                              lookup_branch=args.lookup_branch, min_branch_q=args.min_branch_q,
                              min_expand_q=args.min_expand_q)
    config.validate()  # fail on bad settings before any model loads
    drafters = {config.spec.drafter: args.drafter} if args.drafter and config.spec.has_model else {}
    models = Models(args.target, drafters, device=args.device, dtype=args.dtype, drafter_dtype=args.drafter_dtype,
                    cuda_graphs=False if args.no_cuda_graphs else None)
    summary: Summary | None = None
    for event in generate(models, args.prompt, config, chat=not args.no_chat):
        if isinstance(event, RoundRecord):
            if args.verbose:
                print(f"round {event.index}: {event.shape_name} accepted {event.accepted_len} "
                      f"draft {event.draft_ms:.1f} ms verify {event.verify_ms:.1f} ms", file=sys.stderr)
            if not args.json:
                print("".join(t.text for t in event.emitted), end="", flush=True)
        else:
            summary = event
    assert summary is not None
    if args.json:
        print(json.dumps(summary.to_dict()))
    else:
        print(f"\n[{summary.method}, target in {summary.extra['dtype']}] {summary.new_tokens} tokens in "
              f"{summary.seconds:.2f} s "
              f"({summary.tokens_per_s:.1f} tok/s), {summary.rounds} rounds, "
              f"mean accepted length {summary.mean_accepted_len:.2f}", file=sys.stderr)
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="compare methods on a prompt set; prints a markdown table")
    b.add_argument("--prompts", nargs="*", default=None, help="JSONL files (default: assets/prompts/*.jsonl)")
    b.add_argument("--methods", default=None,
                   help="comma-separated; a fixed shape as name:tree, e.g. mamba-tree:3;2;1 (';' inside the tree); "
                        "a bandit's reward as name@reward, e.g. mamba-ucb@throughput; its arms as name:arms, "
                        "'|' between arms, e.g. mamba-ucb:0|3|2;1;1 (default: "
                        f"{DEFAULT_BENCH_METHODS}, unless only --cost-curve or --context-lengths is asked for)")
    b.add_argument("--max-new-tokens", type=int, default=128)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--limit", type=int, default=None, help="use the first N prompts, alternating kinds")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for hf-lookup")
    b.add_argument("--bandit-scope", default="session", choices=BANDIT_SCOPES,
                   help="*-ucb methods: one bandit for the whole run, as the app keeps one per browser session "
                        "(session), or a fresh one per prompt (prompt)")
    b.add_argument("--arms", default=None, help=ARMS_HELP)
    b.add_argument("--reward", default="pooled", choices=REWARDS, help="bandit reward for *-ucb")
    b.add_argument("--lambda-ucb", type=float, default=None, help="bandit exploration weight for *-ucb")
    b.add_argument("--min-branch-q", type=float, default=None, help=MIN_BRANCH_Q_HELP)
    b.add_argument("--min-expand-q", type=float, default=None, help=MIN_EXPAND_Q_HELP)
    b.add_argument("--context-lengths", default=None, help="e.g. 256,1024,4096: drafter latency/memory study")
    b.add_argument("--cost-curve", default=None,
                   help="e.g. 400,2000: what verifying 1-16 tokens costs, in target steps, after that many tokens")
    b.add_argument("--long", nargs="?", const=",".join(map(str, LONG_LENGTHS)), default=None, metavar="TOKENS",
                   help="the long-context comparison instead of the prompt files: summaries of three passages of "
                        "the Python docs cut at each length, e.g. --long 2500,4500,7500, or `--long examples`: the "
                        "app's three long-document examples (what its Long documents page shows) (default "
                        f"{','.join(map(str, LONG_LENGTHS))}; --limit N: the first N passages a length), with a "
                        "table of where the time goes per length")
    b.add_argument("--licences", action="store_true",
                   help="instead of the prompt files: summaries of the start of three licence texts, about 2,400 "
                        "tokens each (Debian's Apache-2.0, GPL-1 and GPL-2, which the distillation corpus holds out), "
                        "with the table of where the time goes")
    b.add_argument("--out", default="results.json")
    b.add_argument("--csv", default=None)
    b.add_argument("--plot", default="context.html", help="where the context-length plot is written")
    b.add_argument("--target", default=DEFAULT_TARGET)
    for kind in KINDS.values():
        if kind.flag:
            b.add_argument(kind.flag, default=kind.model, help=f"drafter of the {kind.prefix}-* methods")
    b.add_argument("--device", default="auto")
    b.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    b.add_argument("--drafter-dtype", default="auto", help=DRAFTER_DTYPE_HELP)
    b.add_argument("--no-cuda-graphs", action="store_true", help=NO_GRAPHS_HELP)
    b.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from specdec import bench

    if args.long and args.licences:
        raise ValueError("--long and --licences are two prompt sets: pick one")
    models = Models(args.target, {name: getattr(args, KINDS[name].option) for name in MODEL_KINDS},
                    device=args.device, dtype=args.dtype, drafter_dtype=args.drafter_dtype,
                    cuda_graphs=False if args.no_cuda_graphs else None)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    result: dict = {}
    if args.context_lengths:
        lengths = [int(x) for x in args.context_lengths.split(",")]
        study = bench.context_study(models, lengths, log=log)
        bench.save_context_plot(study, args.plot)
        result["context_study"] = study
        print(bench.context_table(study) + "\n")
    if args.cost_curve:
        cost = bench.verification_cost(models, [int(x) for x in args.cost_curve.split(",")], list(range(1, 17)),
                                       log=log)
        result["verification_cost"] = cost
        print(bench.cost_table(cost) + "\n")
    if args.methods is None and not (args.cost_curve or args.context_lengths):
        args.methods = DEFAULT_BENCH_METHODS
    if args.methods:
        methods = _split_methods(args.methods)
        if args.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if args.long == "examples":
            prompts = bench.example_prompts()
        elif args.long:
            lengths = [int(x) for x in args.long.split(",")]
            prompts = bench.long_prompts(models.target.tokenizer, lengths, bench.LONG_TOPICS[: args.limit or None])
        elif args.licences:
            prompts = licence_prompts()[: args.limit or None]
        else:
            prompts = bench.load_prompts(args.prompts, args.limit)
        result.update(bench.benchmark(models, prompts, methods, args.max_new_tokens, args.temperature, args.repeats,
                                      args.seed, args.lookup_tokens, args.bandit_scope, args.arms, args.reward,
                                      args.lambda_ucb, args.min_branch_q, args.min_expand_q, log=log))
        print(bench.markdown_table(result))
        if args.long or args.licences:
            print("\n" + bench.breakdown_table(result))
        if args.csv:
            bench.write_csv(result, args.csv)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


def _split_methods(text: str) -> list[str]:
    """Split 'ar,mamba-tree:3;2;1,lookup-chain' on commas; ';' separates widths inside a tree."""
    return [m.strip().replace(";", ",") for m in text.split(",") if m.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_bench(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
