""""How it works": one page, the round in four steps, with the numbers of the round on screen filled in."""

from __future__ import annotations

import html

from demo.captions import quoted
from demo.live import WAYS
from demo.tree_svg import target_token
from specdec.records import RoundRecord, Summary
from specdec.tree import TreeShape

PAGE = ("max-width:860px;font-family:ui-sans-serif,system-ui,sans-serif;font-size:18px;line-height:1.6;color:#111;"
        "background:#fff;padding:8px 4px")
NO_RUN = "Run a prompt (or replay a recorded run) and this page fills in with that round's own numbers."


def _step(number: int, title: str, body: str) -> str:
    return (f'<section class="sd-step" data-step="{number}" style="margin:14px 0">'
            f'<h3 style="margin:0 0 4px;font-size:21px">{number}. {html.escape(title)}</h3>'
            f"<p style='margin:0'>{body}</p></section>")


def _n(value: float | int, digits: int = 1) -> str:
    return f"<b>{value:.{digits}f}</b>" if isinstance(value, float) else f"<b>{value}</b>"


def draft_step(r: RoundRecord) -> str:
    drafted = len(r.nodes) - 1
    if drafted == 0:
        if r.shape:
            return (f"In this round nothing was drafted: the shape {html.escape(r.shape_name)} was chosen, but the "
                    "drafter found none of its guesses likely enough to be worth checking, so the target wrote one "
                    "token on its own.")
        return "In this round nothing was drafted: the method let the target write one token on its own."
    copied = sum(n.copied for n in r.nodes)
    where = "one chain" if all(w == 1 for w in r.shape) else f"a tree of shape {html.escape(r.shape_name)}"
    text = (f"The small drafter guessed {_n(drafted - copied)} tokens as {where} "
            f"(at each depth, that many alternatives per node), in {_n(r.draft_ms)} ms.")
    # a drafter of another tokenizer re-encodes its tree: its node count is not the shape's
    left_out = TreeShape(tuple(r.shape)).num_drafted - (drafted - copied) if r.mapping_ms is None else 0
    if left_out > 0:
        text += (f" It left out {_n(left_out)} more the shape allows: branches it found too unlikely to be worth a "
                 "place in the target's pass.")
    if r.mapping_ms is not None:
        text += (f" Its tokenizer is not the target's: its guesses were turned into text and re-encoded in the "
                 f"target's tokens ({_n(r.mapping_ms)} ms of the round, with the catch-up after it).")
    if copied:
        text += f" Prompt lookup added {_n(copied)} tokens copied from earlier in the text, as one more branch."
    return text


def verify_step(r: RoundRecord) -> str:
    drafted = len(r.nodes) - 1
    return (f"The large target read all {_n(drafted)} guesses in <b>one</b> forward pass ({_n(r.verify_ms)} ms): "
            "a tree attention mask lets every guess see only the tokens on its own branch. For each guess it "
            "computes <i>p</i>, its own probability of that token, next to the drafter's <i>q</i>.")


def accept_step(r: RoundRecord) -> str:
    accepted = "".join(t.text for t in r.emitted if t.source == "draft")
    kept = (f"kept {_n(r.accepted_len)} of them, {html.escape(quoted(accepted))}" if r.accepted_len
            else "kept none of them")
    added = target_token(r)
    extra = ""
    if added:
        kind = ("a <b>bonus</b> token: the whole branch was accepted, so the same pass gives one more"
                if added[1] == "bonus" else
                "a <b>correction</b>: where the guesses were rejected, the target writes its own token instead")
        extra = f" and added {html.escape(quoted(added[0]))}, {kind}"
    return (f"Walking down the tree, each guess is kept with probability min(1, <i>p</i>/<i>q</i>) (with "
            f"temperature 0: kept when it is the target's top choice). The target {kept}{extra}. So this round "
            f"wrote {_n(len(r.emitted))} tokens for one target pass; the text is exactly what the target alone "
            "would have written.")


def bandit_step(r: RoundRecord) -> str:
    b = r.bandit
    if b is None:
        return (f"This method uses a fixed shape, so there is no choice to learn. With Drafting set to "
                f"“{WAYS['ucb']}”, a UCB bandit picks the shape each round from what paid off so far.")
    arm = b.arms[b.chosen]
    mean = "untried" if arm.mean_reward is None else f"{arm.mean_reward:.2f}"
    ucb = "not computed yet (every shape is tried once first)" if arm.ucb is None else f"{arm.ucb:.2f}"
    reward = "" if b.last_reward is None else f"This round scored {_n(b.last_reward, 2)}; "
    return (f"The bandit had chosen the shape {html.escape(arm.name)}, one of {_n(len(b.arms))} it picks from. "
            f"{reward}counting this round it has used that shape {_n(arm.pulls)} times, with a mean reward of "
            f"<b>{mean}</b>. Its UCB value is now <b>{ucb}</b>: the mean reward plus a bonus for shapes tried less "
            f"often. Next round the bandit takes the shape with the highest UCB value. (Reward: "
            f"{html.escape(b.reward_kind)}; {REWARD_MEANING.get(b.reward_kind, '')})")


REWARD_MEANING = {"pooled": "a shape's tokens per second: the tokens its rounds should emit, from how often the "
                            "drafter's guesses were kept at each depth in recent rounds of any shape, over the "
                            "seconds its rounds took; 1 for the fastest",
                  "throughput": "a shape's tokens per second over all its rounds, 1 for the fastest so far",
                  "paper": "more tokens per target pass scores higher"}


def run_line(rounds: list[RoundRecord], summary: Summary | None) -> str:
    tokens = summary.new_tokens if summary else rounds[-1].new_tokens_total
    per_pass = tokens / len(rounds)
    return (f'<p class="sd-run-line" style="margin-top:18px;padding:8px 12px;background:#f4f8fb;'
            f'border-left:4px solid #0072b2">Over the run so far: {_n(tokens)} tokens in {_n(len(rounds))} target '
            f"pass{'' if len(rounds) == 1 else 'es'}, {_n(per_pass, 2)} tokens per pass (the target alone writes 1 "
            "per pass).</p>")


def explainer_html(record: RoundRecord | None, rounds: list[RoundRecord], summary: Summary | None = None) -> str:
    """The four steps of `record`'s round in plain words, with its numbers; a general version without a run."""
    if record is None:
        steps = [("Draft", "A small, fast drafter guesses several next tokens, as a tree of alternatives."),
                 ("Verify", "The large target checks every guess in one forward pass."),
                 ("Accept", "The longest branch the target agrees with is kept, plus one token of the target's own."),
                 ("Choose", "A bandit learns which tree shape pays off and picks the next round's shape.")]
        body = "".join(_step(i, t, html.escape(b)) for i, (t, b) in enumerate(steps, start=1))
        return (f'<div class="sd-explainer" style="{PAGE}"><h2>How it works</h2>{body}'
                f'<p style="color:#555">{NO_RUN}</p></div>')
    steps = [("The drafter guesses", draft_step(record)), ("The target checks, in one pass", verify_step(record)),
             ("Keep what the target agrees with", accept_step(record)),
             ("The bandit picks the shape", bandit_step(record))]
    body = "".join(_step(i, t, b) for i, (t, b) in enumerate(steps, start=1))
    return (f'<div class="sd-explainer" style="{PAGE}"><h2>How it works: round {record.index + 1}</h2>{body}'
            f"{run_line(rounds[: record.index + 1], summary if record is rounds[-1] else None)}</div>")
