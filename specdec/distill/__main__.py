"""`python -m specdec.distill STAGE ...`: the drafter pipeline, one resumable stage at a time, or `all`.

Stages: corpus -> [sources] -> teacher -> [features] -> train -> evaluate -> export (`sources`: self-instruct
prompts and chats, a corpus part of their own; `features`: for `--arch mamba-feat`);
`compare --runs a,b` prints runs' learning curves side by side. Data goes under `--data` (default `data/distill`,
git-ignored); each stage skips what is already on disk, so rerunning a stopped command continues it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec.distill.teacher import BATCH_TOKENS, teacher_dtype
from specdec.distill.train import RECIPES
from specdec.models import ASSETS, DEFAULT_TARGET, load_model


_LOADED: dict[tuple[str, str], object] = {}


def _target(args: argparse.Namespace, dtype: str):
    """The target in `dtype`, loaded once per process: `all` runs four stages that need it (two dtypes)."""
    key = (args.target, teacher_dtype(dtype))
    if key not in _LOADED:
        _LOADED.clear()  # keep one copy in memory: the bf16 teacher is not needed once training starts
        _LOADED[key] = load_model(args.target, torch.device("cpu"), key[1])
    return _LOADED[key]


def stage_corpus(args: argparse.Namespace) -> None:
    from specdec.distill.corpus import write_corpus

    folder = write_corpus(args.data, args.prompts_per_domain, args.eval_per_domain, args.text_chars, args.seed,
                          args.parts, args.long_prompts, args.long_eval, args.system_prompts, args.system_eval)
    print(f"corpus in {folder}")


def stage_sources(args: argparse.Namespace) -> None:
    """Prompts the target writes itself and two-turn chats, appended to the corpus as its next part."""
    from specdec.distill.sources import add_sources

    target = _target(args, args.teacher_dtype)
    part = add_sources(target.model, target.tokenizer, args.data / "corpus", args.self_prompts, args.self_eval,
                       args.chat_prompts, args.chat_eval, args.seed, args.batch_size)
    print(f"self-instruct prompts and chats in corpus part {part}: answer them with `teacher --part {part}`")


def stage_teacher(args: argparse.Namespace) -> None:
    from specdec.distill import teacher
    from specdec.distill.train import reuse_freed_memory

    reuse_freed_memory()  # this process only labels: logits of [batch, length, V] come and go
    target = _target(args, args.teacher_dtype)
    corpus, out = args.data / "corpus", args.data / "teacher"
    common = dict(batch_size=args.batch_size, shard_prompts=args.shard_prompts, max_new_tokens=args.max_new_tokens,
                  k=args.topk, batch_tokens=args.batch_tokens)
    teacher.generate_responses(target.model, target.tokenizer, corpus, out, "eval", part=args.part, **common)
    teacher.generate_responses(target.model, target.tokenizer, corpus, out, "train", minutes=args.response_minutes,
                               max_shards=args.response_shards, part=args.part, **common)
    teacher.generate_sampled(target.model, target.tokenizer, corpus, out, args.sampled_passes,
                             args.sampling_temperature, minutes=args.sampled_minutes, max_shards=args.sampled_shards,
                             **common)
    teacher.label_text(target.model, target.tokenizer, corpus, out, args.window, args.label_batch, args.shard_windows,
                       args.topk, minutes=args.text_minutes, max_shards=args.text_shards, features=args.text_features)
    print(json.dumps(teacher.summarize(out), indent=1))


def stage_features(args: argparse.Namespace) -> None:
    """The target's last hidden state at every teacher position, beside each shard (for `--arch mamba-feat`)."""
    from specdec.distill.feat import add_features
    from specdec.distill.train import response_folders

    target = _target(args, args.teacher_dtype)
    teacher = args.data / "teacher"
    for folder in [teacher / "responses" / "eval", *response_folders(teacher), teacher / "text"]:
        if folder.is_dir():
            add_features(target.model, folder, args.label_batch, minutes=args.text_minutes)


def stage_train(args: argparse.Namespace) -> None:
    from specdec.distill.recipe import TrainConfig, target_weights
    from specdec.distill.train import recipe_for, reuse_freed_memory, train

    reuse_freed_memory()  # this process only trains: large activations come and go every step
    config = TrainConfig(arch=args.arch, minutes=args.minutes, max_tokens=args.max_tokens, seq_len=args.seq_len,
                         batch_size=args.train_batch, lr=args.lr, draft_vocab=args.draft_vocab, seed=args.seed,
                         response_share=args.response_share, eval_every=args.eval_every, threads=args.threads,
                         hidden=args.hidden, mamba_layers=args.layers, tf_layers=args.layers,
                         init=str(args.init) if args.init else None, grow_layers=args.grow_layers,
                         state_size=args.state_size, grow_state=args.grow_state,
                         tokenizer=str(args.tokenizer) if args.tokenizer else None)
    run = args.data / "runs" / args.name
    saved = json.loads((run / "train_config.json").read_text()) if (run / "ckpt.pt").exists() else None
    if saved:  # a resumed run keeps the tokenizer it was started with
        config.tokenizer = saved.get("tokenizer")
    if config.tokenizer:  # a drafter of its own tokenizer: the target's tokenizer reads the teacher's shards
        from transformers import AutoTokenizer

        target = _target(args, "float32")
        embedding = None if saved else target_weights(target.model)[0]
        train(args.data / "teacher", run, config, embedding, len(AutoTokenizer.from_pretrained(config.tokenizer)),
              target_tokenizer=target.tokenizer)
        return
    if saved and not recipe_for(args.arch).reads_target:  # resume: E was read on the fresh run
        train(args.data / "teacher", run, config, None, saved["vocab_size"])
        return
    embedding, head = target_weights(_target(args, "float32").model)
    train(args.data / "teacher", run, config, embedding, len(embedding), head)


def stage_tokenizer(args: argparse.Namespace) -> None:
    """Train the drafter's own byte-level BPE on the corpus (into `--tokenizer`, default DATA/tokenizer)."""
    from transformers import AutoTokenizer

    from specdec.distill.tokenizer import overlap, train_tokenizer

    target = _target(args, "float32").tokenizer
    folder = train_tokenizer(args.data / "corpus", args.tokenizer or args.data / "tokenizer", args.tokenizer_vocab,
                             target)
    print(f"tokenizer in {folder}: {json.dumps(overlap(target, AutoTokenizer.from_pretrained(folder)))}")


def stage_evaluate(args: argparse.Namespace) -> None:
    from specdec.distill.evaluate import evaluate

    report = evaluate(_target(args, "float32"), args.data / "teacher", args.data / "runs" / args.name,
                      args.engine_prompts, args.max_new_tokens_eval)
    print(json.dumps(report, indent=1))


def stage_export(args: argparse.Namespace) -> None:
    from specdec.distill.export import export

    folder = export(args.data / "runs" / args.name, args.out or ASSETS / "drafters" / args.name,
                    _target(args, "float32").tokenizer, args.data / "teacher")
    print(f"exported to {folder}")


def stage_compare(args: argparse.Namespace) -> None:
    """Print the learning curves of `--runs` side by side (a markdown table)."""
    from specdec.distill.compare import compare_table

    if not args.runs:
        raise SystemExit("compare needs --runs NAME,NAME (folders under DATA/runs)")
    runs = [args.data / "runs" / name for name in args.runs.split(",")]
    missing = [str(run) for run in runs if not (run / "curve.jsonl").is_file()]
    if missing:
        raise SystemExit(f"no learning curve in {', '.join(missing)}")
    print(compare_table(runs))


def stage_all(args: argparse.Namespace) -> None:
    from specdec.distill.train import recipe_for

    stages = (stage_corpus, stage_teacher, stage_features, stage_train, stage_evaluate, stage_export)
    for stage in stages if recipe_for(args.arch).reads_features else [s for s in stages if s is not stage_features]:
        stage(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdec.distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=["corpus", "sources", "tokenizer", "teacher", "features", "train", "evaluate",
                                     "export", "compare", "all"])
    p.add_argument("--target", default=DEFAULT_TARGET, help="target preset, folder, .gguf or hub id")
    p.add_argument("--data", type=Path, default=Path("data/distill"), help="working folder (resumable)")
    p.add_argument("--seed", type=int, default=0)
    _corpus_options(p.add_argument_group("corpus"))
    _sources_options(p.add_argument_group("sources (the target writes prompts; --batch-size, --teacher-dtype apply)"))
    _teacher_options(p.add_argument_group("teacher"))
    _train_options(p.add_argument_group("train / evaluate / export"))
    p.add_argument_group("compare").add_argument("--runs", default=None,
                                                 help="comma-separated run names whose learning curves to tabulate")
    return p


def _corpus_options(corpus: argparse._ArgumentGroup) -> None:
    corpus.add_argument("--prompts-per-domain", type=int, default=1500)
    corpus.add_argument("--eval-per-domain", type=int, default=16)
    corpus.add_argument("--text-chars", type=int, default=4_000_000, help="raw text to label, in characters")
    corpus.add_argument("--long-prompts", type=int, default=0,
                        help="training prompts over passages of long documents (domain `long`) in a new corpus")
    corpus.add_argument("--long-eval", type=int, default=0, help="held-out prompts of the `long` domain")
    corpus.add_argument("--system-prompts", type=int, default=0,
                        help="training prompts over the machine's own documentation (manual pages, READMEs): "
                             "the `system` domain")
    corpus.add_argument("--system-eval", type=int, default=0, help="held-out prompts of the `system` domain")
    corpus.add_argument("--parts", type=int, default=1,
                        help="append training-prompt parts until there are this many (part 0: the first corpus; each "
                             "later part: --prompts-per-domain new prompts; existing prompts never change)")


def _sources_options(sources: argparse._ArgumentGroup) -> None:
    sources.add_argument("--self-prompts", type=int, default=2000,
                         help="training prompts the target writes itself from seed topics (the `self` domain)")
    sources.add_argument("--self-eval", type=int, default=32, help="held-out `self` prompts, from held-out topics")
    sources.add_argument("--chat-prompts", type=int, default=1000,
                         help="two-turn chats: a corpus prompt, the target's answer, a follow-up (the `turns` domain)")
    sources.add_argument("--chat-eval", type=int, default=16, help="held-out chats, opened by held-out prompts")


def _teacher_options(teacher: argparse._ArgumentGroup) -> None:
    teacher.add_argument("--teacher-dtype", default="auto",
                         help="the teacher's (and the features') precision; auto: bfloat16 where the CPU multiplies it "
                              "natively (AMX, AVX512-BF16), else float32, faster than emulated bf16 (docs/training.md, "
                              "Precision)")
    teacher.add_argument("--batch-size", type=int, default=64, help="prompts answered at once, at most")
    teacher.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS,
                         help="padded positions (prompt + answer) a batch of answers holds, at most: long prompts go "
                              "in smaller batches")
    teacher.add_argument("--shard-prompts", type=int, default=64)
    teacher.add_argument("--max-new-tokens", type=int, default=128)
    teacher.add_argument("--topk", type=int, default=8)
    teacher.add_argument("--window", type=int, default=256)
    teacher.add_argument("--label-batch", type=int, default=8)
    teacher.add_argument("--shard-windows", type=int, default=64)
    teacher.add_argument("--response-shards", type=int, default=None, help="stop after this many answer shards")
    teacher.add_argument("--part", type=int, default=0,
                         help="answer the training prompts of this corpus part (into responses/train-partK)")
    teacher.add_argument("--text-shards", type=int, default=None, help="stop after this many text shards")
    teacher.add_argument("--response-minutes", type=float, default=None, help="stop generating after this long")
    teacher.add_argument("--sampled-passes", type=int, default=0,
                         help="after the greedy answers, this many passes of sampled answers to the training prompts")
    teacher.add_argument("--sampling-temperature", type=float, default=0.8)
    teacher.add_argument("--sampled-shards", type=int, default=None, help="stop after this many sampled shards in all")
    teacher.add_argument("--sampled-minutes", type=float, default=None, help="stop sampling after this long")
    teacher.add_argument("--text-minutes", type=float, default=None, help="stop labelling text after this long")
    teacher.add_argument("--text-features", action="store_true",
                         help="keep the target's features of the text-labelling pass too (for --arch mamba-feat)")


def _train_options(train: argparse._ArgumentGroup) -> None:
    train.add_argument("--arch", choices=list(RECIPES), default="mamba",
                       help="mamba-feat: the drafter reading the target's hidden state (run the features stage)")
    train.add_argument("--name", default="mamba-smollm2", help="run name; export folder assets/drafters/NAME")
    train.add_argument("--minutes", type=float, default=60.0, help="training wall-time budget")
    train.add_argument("--max-tokens", type=int, default=None, help="training token budget")
    train.add_argument("--hidden", type=int, default=256, help="the drafter's width (a fresh run only)")
    train.add_argument("--layers", type=int, default=4, help="the drafter's layers (a fresh run only)")
    train.add_argument("--init", type=Path, default=None,
                       help="start a fresh run from this exported drafter folder of the same --arch (its weights, "
                            "draft vocabulary and size; a new optimizer), e.g. assets/drafters/mamba-smollm2")
    train.add_argument("--grow-layers", type=int, default=0,
                       help="with --init: append this many layers to the folder's, each starting as the identity")
    train.add_argument("--state-size", type=int, default=16,
                       help="a Mamba drafter's SSM state channels per inner channel (a fresh run only)")
    train.add_argument("--grow-state", type=int, default=0,
                       help="with --init: widen a Mamba drafter's state to this many channels, its outputs unchanged")
    train.add_argument("--tokenizer", type=Path, default=None,
                       help="the drafter's own tokenizer folder (the `tokenizer` stage writes one): a Mamba drafter "
                            "for a target of another tokenizer, the engine's xmamba kind")
    train.add_argument("--tokenizer-vocab", type=int, default=8192, help="the `tokenizer` stage's vocabulary size")
    train.add_argument("--seq-len", type=int, default=256)
    train.add_argument("--train-batch", type=int, default=16)
    train.add_argument("--lr", type=float, default=2e-3)
    train.add_argument("--response-share", type=float, default=0.5,
                       help="fraction of each batch cut from the target's answers (the rest from labelled text)")
    train.add_argument("--draft-vocab", type=int, default=8192, help="reduced draft head size (0 = full)")
    train.add_argument("--eval-every", type=int, default=200, help="steps between held-out checks and checkpoints")
    train.add_argument("--threads", type=int, default=None)
    train.add_argument("--engine-prompts", type=int, default=2, help="held-out prompts per domain run through the engine")
    train.add_argument("--max-new-tokens-eval", type=int, default=48)
    train.add_argument("--out", type=Path, default=None, help="export folder (default assets/drafters/NAME)")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    {"corpus": stage_corpus, "sources": stage_sources, "tokenizer": stage_tokenizer, "teacher": stage_teacher,
     "features": stage_features, "train": stage_train, "evaluate": stage_evaluate, "export": stage_export,
     "compare": stage_compare, "all": stage_all}[args.stage](args)


if __name__ == "__main__":
    main()
