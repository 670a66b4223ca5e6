"""Stage (a): an instruction corpus and a raw-text corpus, built offline and reproducibly.

Prompts come from written templates filled by a seeded RNG, in four domains (code, math, chat, summary);
code snippets and prose passages are cut from the Python standard library that every install carries
(its sources, its docstrings and `pydoc_data.topics`, the language reference). Raw text from the same
place is labelled later with one target forward pass (cheap soft labels, see `teacher.label_text`).
On request a fifth domain, `long`, asks about passages of 750-2,800 tokens of long documents: the standard
library's, the system's licence and copyright texts and the installed packages' (`long_documents`).

Every prompt has a `split`: "train" or "eval"; eval prompts are never used for training. And a `part`: 0 for the
corpus as first built, K for the K-th set of training prompts appended later (`corpus --parts`), drawn with its
own seed and never equal to an earlier prompt, so the prompts already answered, and their shards, stay as they were.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import random
import sysconfig
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

DOMAINS = ("code", "math", "chat", "summary")

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "merges two sorted lists", "counts the words in a sentence", "removes duplicates from a list while keeping order",
    "finds the largest element of a list", "converts Celsius to Fahrenheit", "checks whether a string is a palindrome",
    "flattens a nested list", "computes the factorial of n", "sorts a list of dictionaries by a key",
    "reads a CSV file and returns its rows", "counts the vowels in a string", "computes the average of a list",
    "finds the greatest common divisor of two numbers", "transposes a matrix", "groups words by their first letter",
    "returns the second largest number in a list", "validates an email address with a regular expression",
    "implements binary search", "implements bubble sort", "implements a stack class", "implements a queue with two stacks",
    "parses a date string", "computes the running sum of a list", "finds all anagrams of a word in a list",
    "capitalizes every word in a sentence", "checks whether two strings are anagrams", "rotates a list by k positions",
    "returns the most common element of a list", "splits a list into chunks of size n", "computes a dot product",
    "converts a decimal number to binary", "counts lines in a text file", "finds the intersection of two lists",
    "generates all permutations of a string", "computes the power set of a set", "checks balanced parentheses",
    "implements a simple LRU cache", "downloads nothing but simulates a retry loop", "computes the median of a list",
    "converts a Roman numeral to an integer", "finds the longest common prefix of strings", "fizzbuzz up to n",
    "computes the sum of digits of a number", "removes whitespace from both ends of every line", "zips two lists into a dict",
    "implements a linked list with insert and delete", "computes the Levenshtein distance between two strings",
]
CODE_LANGS = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Rust", "Go", "Bash"]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Show me how to write a {lang} program that {task}.",
    "Can you write {lang} code that {task}? Add comments.",
    "Write a function in {lang} that {task}, and give an example of calling it.",
]
CODE_SNIPPET_TEMPLATES = [
    "Explain what the following Python code does:\n\n```python\n{code}\n```",
    "Add a docstring to this Python function:\n\n```python\n{code}\n```",
    "Review this Python code and suggest improvements:\n\n```python\n{code}\n```",
]

CHAT_TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "climate change", "the French Revolution", "machine learning",
    "the immune system", "inflation", "volcanoes", "the internet", "democracy", "DNA", "gravity", "the Roman Empire",
    "renewable energy", "sleep", "coffee", "the stock market", "electric cars", "meditation", "the Moon",
    "vaccines", "earthquakes", "bees", "the printing press", "rainbows", "batteries", "clouds", "recycling",
    "the human heart", "social media", "chess", "jazz music", "the Olympic Games", "tea", "deserts", "whales",
    "solar panels", "blockchain", "the Great Wall of China", "antibiotics", "time zones", "the periodic table",
]
CHAT_ACTIVITIES = [
    "learning a new language", "staying productive at home", "saving money", "running a first marathon",
    "cooking for a family", "studying for exams", "starting a vegetable garden", "sleeping better", "public speaking",
    "writing a resume", "traveling on a budget", "keeping a houseplant alive", "learning to code", "reducing stress",
    "making new friends in a new city", "training a puppy", "preparing for a job interview", "reading more books",
]
CHAT_FORMS = ["poem", "story", "haiku", "limerick", "dialogue", "product description", "email", "tweet"]
CHAT_TEMPLATES = [
    "What is {topic}?", "Explain {topic} to a ten-year-old.", "Tell me three interesting facts about {topic}.",
    "What are the pros and cons of {topic}?", "Give me {n} tips for {activity}.", "How do I get better at {activity}?",
    "Write a short {form} about {topic}.", "Hi! Can you help me with {activity}?", "Why is {topic} important?",
    "Compare {topic} and {topic2}.", "Write a friendly email inviting a colleague to talk about {topic}.",
]

MATH_TEMPLATES = [
    "A shop sells {item} for ${p} each. How much do {a} {item} cost?",
    "{name} has {a} {item} and gives away {b}. Then {name} buys {c} more. How many {item} does {name} have now?",
    "Solve for x: {a}x + {b} = {c}.",
    "What is {a} multiplied by {b}?",
    "What is {a}% of {c}?",
    "A train travels {a} km in {b} hours. What is its average speed?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
    "Simplify the fraction {a}/{c}.",
    "{name} reads {a} pages a day. How many days does a {c}-page book take?",
    "What is the sum of the integers from 1 to {c}?",
    "Is {c} a prime number? Explain.",
    "Compute {a} + {b} * {p} - {c} step by step.",
]
MATH_ITEMS = ["apples", "pencils", "books", "tickets", "cookies", "marbles", "stickers", "oranges"]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena"]

SUMMARY_TEMPLATES = [
    "Summarize the following text in two sentences:\n\n{text}",
    "Give a short title and a one-paragraph summary of this text:\n\n{text}",
    "What are the key points of the following passage?\n\n{text}",
    "Explain this passage in simple words:\n\n{text}",
]


@dataclass(frozen=True)
class Prompt:
    id: str
    domain: str
    split: str  # "train" | "eval"
    text: str
    part: int = 0  # 0: the corpus as first built; k > 0: the k-th set of training prompts added later (`more_prompts`)
    history: tuple[str, ...] = ()  # earlier turns of a chat, user first, alternating with the target's answers

    def __post_init__(self) -> None:
        object.__setattr__(self, "history", tuple(self.history))  # a list when read back from JSON


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@functools.cache
def _stdlib_files() -> tuple[Path, ...]:
    root = stdlib_dir()
    skip = ("test", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip", "tkinter", "pydoc_data")
    return tuple(sorted(p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts)))


@functools.cache
def _parse(path: Path) -> tuple[str, ast.Module | None]:
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        return source, ast.parse(source)
    except SyntaxError:
        return source, None


def _functions(path: Path, max_lines: int = 18) -> Iterator[str]:
    """Short top-level or method function definitions of one source file, as source text."""
    source, tree = _parse(path)
    if tree is None:
        return
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and 4 <= node.end_lineno - node.lineno + 1 <= max_lines:
            body = lines[node.lineno - 1:node.end_lineno]
            indent = len(body[0]) - len(body[0].lstrip())
            yield "\n".join(line[indent:] for line in body)


def _prose_documents() -> list[tuple[str, str]]:
    """(source key, text): the language reference topics and the module docstrings of the standard library."""
    from pydoc_data.topics import topics

    docs = [(f"topic:{key}", topics[key]) for key in sorted(topics)]
    for path in _stdlib_files():
        tree = _parse(path)[1]
        doc = ast.get_docstring(tree) if tree is not None else None
        if doc:
            docs.append((str(path.relative_to(stdlib_dir())), doc))
    return docs


def _passages(docs: list[tuple[str, str]], min_chars: int = 300, max_chars: int = 800) -> list[tuple[str, str]]:
    """(source key, passage) pieces of prose documents, short enough to sit in a prompt."""
    passages = []
    for key, doc in docs:
        for para in doc.split("\n\n\n") if len(doc) > max_chars else [doc]:
            para = para.strip()
            if min_chars <= len(para):
                passages.append((key, para[:max_chars]))
    return passages


def held_out(key: str, every: int = 8) -> bool:
    """Whether a source (file or topic) is reserved for eval prompts: never in training prompts or text."""
    return zlib.crc32(key.encode()) % every == 0


def _math_prompt(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(10, 400)
    return rng.choice(MATH_TEMPLATES).format(a=a, b=b, c=c, p=rng.randint(2, 15), item=rng.choice(MATH_ITEMS),
                                             name=rng.choice(NAMES))


def _chat_prompt(rng: random.Random) -> str:
    topic, topic2 = rng.sample(CHAT_TOPICS, 2)
    return rng.choice(CHAT_TEMPLATES).format(topic=topic, topic2=topic2, activity=rng.choice(CHAT_ACTIVITIES),
                                             form=rng.choice(CHAT_FORMS), n=rng.randint(3, 7))


def _code_prompt(rng: random.Random, snippets: list[str]) -> str:
    if rng.random() < 0.6:
        return rng.choice(CODE_TEMPLATES).format(lang=rng.choice(CODE_LANGS), task=rng.choice(CODE_TASKS))
    return rng.choice(CODE_SNIPPET_TEMPLATES).format(code=rng.choice(snippets))


def _unique(make: Callable[[], str], n: int, taken: frozenset[str] = frozenset()) -> list[str]:
    seen: set[str] = set()
    for _ in range(n * 20):
        if len(seen) == n:
            break
        text = make()
        if text not in taken:
            seen.add(text)
    return sorted(seen)


@functools.cache
def _sources() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Code snippets and prose passages, each split by source into "train" and "eval" (`held_out`)."""
    snippets = {split: [] for split in ("train", "eval")}
    for path in _stdlib_files():
        split = "eval" if held_out(str(path.relative_to(stdlib_dir()))) else "train"
        snippets[split].extend(_functions(path))
    passages = {split: [] for split in ("train", "eval")}
    for key, passage in _passages(_prose_documents()):
        passages["eval" if held_out(key) else "train"].append(passage)
    return snippets, passages


def _makers(rng: random.Random) -> dict[str, Callable[[str], str]]:
    """One prompt writer per domain, `split` -> a prompt drawn from that split's sources."""
    snippets, passages = _sources()
    return {
        "code": lambda split: _code_prompt(rng, snippets[split]),
        "math": lambda split: _math_prompt(rng),
        "chat": lambda split: _chat_prompt(rng),
        "summary": lambda split: rng.choice(SUMMARY_TEMPLATES).format(text=rng.choice(passages[split])),
    }


def build_prompts(per_domain: int, eval_per_domain: int, seed: int = 0) -> list[Prompt]:
    """`per_domain` training prompts and `eval_per_domain` held-out prompts in each domain.

    Eval prompts never occur in training; their code snippets and passages come from held-out sources only.
    """
    rng = random.Random(seed)
    makers = _makers(rng)
    prompts = []
    for domain in DOMAINS:
        evals = _unique(lambda: makers[domain]("eval"), eval_per_domain)
        eval_texts = set(evals)
        trains = [t for t in _unique(lambda: makers[domain]("train"), per_domain) if t not in eval_texts]
        rng.shuffle(trains)
        prompts += [Prompt(f"{domain}-eval-{i:04d}", domain, "eval", t) for i, t in enumerate(evals)]
        prompts += [Prompt(f"{domain}-{i:05d}", domain, "train", t) for i, t in enumerate(trains)]
    return prompts


def more_prompts(existing: list[Prompt], per_domain: int, part: int, seed: int = 0) -> list[Prompt]:
    """Part `part` (>= 1) of the training prompts: up to `per_domain` new ones per domain from the training sources,
    drawn with the part's own seed, none equal to a prompt of `existing` (either split). A domain whose templates
    are used up gives fewer or none."""
    rng = random.Random(seed * 1_000 + part)
    makers, taken = _makers(rng), frozenset(p.text for p in existing)
    prompts = []
    for domain in DOMAINS:
        texts = _unique(lambda: makers[domain]("train"), per_domain, taken)
        rng.shuffle(texts)
        prompts += [Prompt(f"{domain}-p{part}-{i:05d}", domain, "train", t, part) for i, t in enumerate(texts)]
    return prompts


def build_text_documents(max_chars: int, seed: int = 0) -> list[dict]:
    """Raw documents for soft-label distillation: standard-library source files (code) and prose passages."""
    rng = random.Random(seed + 1)
    root = stdlib_dir()
    code = [{"domain": "code", "text": _parse(p)[0]} for p in _stdlib_files()
            if not held_out(str(p.relative_to(root)))]
    prose = [{"domain": "prose", "text": text} for key, text in _prose_documents() if not held_out(key)]
    docs = code + prose
    rng.shuffle(docs)
    kept, total = [], 0
    for doc in docs:
        if total >= max_chars:
            break
        text = doc["text"][: max_chars - total]
        kept.append({"domain": doc["domain"], "text": text})
        total += len(text)
    return kept


# --- long documents ---------------------------------------------------------------------------------------------
LONG_DOMAIN = "long"  # prompts over a long passage (`corpus --long-prompts`), outside `DOMAINS`' default corpus
LONG_DOC_CHARS = 3_000  # a long document has at least this much text
LONG_CHARS = (3_000, 11_000)  # a long prompt's passage, drawn uniformly in characters (about 750-2,800 tokens)
LONG_TEMPLATES = [
    "Summarise the following document in a few sentences:\n\n{text}",
    "What are the main points of this text?\n\n{text}",
    "Read this and explain in plain words what it says:\n\n{text}",
    "{text}\n\nSummarise the text above in one paragraph.",
    "Give a short overview of this document, then list three things it asks of the reader:\n\n{text}",
]


def _package_texts() -> Iterator[tuple[str, str]]:
    """(key, text): the licence files and long descriptions of the Python packages installed here."""
    from importlib import metadata

    for dist in sorted(metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        for file in dist.files or ():
            name = file.name.upper()
            if ".dist-info" in str(file) and (name.startswith(("LICENSE", "LICENCE", "COPYING", "NOTICE"))
                                              or name == "METADATA"):
                try:
                    text = file.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if name == "METADATA":  # the long description: the body after the headers
                    text = text.partition("\n\n")[2]
                yield f"package:{dist.metadata['Name']}/{file.name}", text


def _system_texts() -> Iterator[tuple[str, str]]:
    """(key, text): Debian's licence texts and the packages' copyright files, where the system has them."""
    from specdec.passages import LICENCES_FOLDER, MEASURED_LICENCES

    if LICENCES_FOLDER.is_dir():
        for path in sorted(LICENCES_FOLDER.iterdir()):
            if path.name not in MEASURED_LICENCES and path.is_file() and not path.is_symlink():
                yield f"licence:{path.name}", path.read_text(encoding="utf-8", errors="replace")
    for path in sorted(Path("/usr/share/doc").glob("*/copyright")):
        try:
            yield f"copyright:{path.parent.name}", path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue


@functools.cache
def long_documents() -> tuple[tuple[str, str], ...]:
    """(source key, text) of every long document: the language reference's long topics and the standard library's
    long module docstrings (except the topics `bench --long` reads), Debian's licence texts and copyright files,
    and the installed packages' licences and descriptions. Documents that share more than `MEASURED_OVERLAP` of
    their shingles with a licence `bench --licences` measures are left out, and so are copies (same words)."""
    from specdec.passages import LONG_TOPICS, MEASURED_LICENCES, MEASURED_OVERLAP, licence_text, overlap, shingles

    measured = set()
    for name in MEASURED_LICENCES:
        try:
            measured |= shingles(licence_text(name))
        except ValueError:  # not on this system: nothing to hold out
            pass
    prose = [(key, text) for key, text in _prose_documents() if key.removeprefix("topic:") not in LONG_TOPICS]
    docs, seen = [], set()
    for key, text in [*prose, *_system_texts(), *_package_texts()]:
        text = text.strip()
        words = " ".join(text.split())
        if len(text) < LONG_DOC_CHARS or words in seen or (measured and overlap(text, measured) > MEASURED_OVERLAP):
            continue
        seen.add(words)
        docs.append((key, text))
    return tuple(docs)


def _long_prompt(rng: random.Random, docs: list[tuple[str, str]]) -> str:
    """A template around a passage of a long document: from the start of a random paragraph, far enough from the
    end for the length drawn from `LONG_CHARS`, cut at a line end near that length."""
    text = rng.choice(docs)[1]
    paragraphs = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
    target = rng.randint(*LONG_CHARS)
    first = 0
    for first in range(rng.randrange(len(paragraphs)), -1, -1):  # back up until the rest is long enough
        if sum(map(len, paragraphs[first:])) >= target:
            break
    passage = "\n\n".join(paragraphs[first:])
    if len(passage) > target:  # cut at the last line end before the length drawn
        passage = passage[: max(passage.rfind("\n", 0, target), target // 2)]
    return rng.choice(LONG_TEMPLATES).format(text=passage.strip())


def document_prompts(domain: str, found: list[tuple[str, str]], make: Callable[[random.Random, list], str],
                     train: int, evals: int, rng: random.Random) -> list[Prompt]:
    """`train` and `evals` prompts of `domain`, each `make(rng, documents)` over documents of its split: eval
    prompts come from held-out documents of `found` ((source key, text) pairs), training prompts from the rest."""
    docs = {split: [(k, t) for k, t in found if held_out(k) == (split == "eval")] for split in ("train", "eval")}
    prompts = []
    for split, n in (("eval", evals), ("train", train)):
        if n and not docs[split]:
            raise ValueError(f"no documents of the {domain} domain for the {split} split on this machine")
        texts = _unique(lambda: make(rng, docs[split]), n)
        prompts += [Prompt(f"{domain}-{split}-{i:05d}", domain, split, t) for i, t in enumerate(texts)]
    return prompts


def long_prompts(train: int, evals: int, seed: int = 0) -> list[Prompt]:
    """`train` and `evals` prompts over long passages (`LONG_DOMAIN`); eval prompts come from held-out documents."""
    if not train and not evals:
        return []
    return document_prompts(LONG_DOMAIN, list(long_documents()), _long_prompt, train, evals, random.Random(seed + 2))


SYSTEM_DOMAIN = "system"  # prompts over the system's own documentation (`corpus --system-prompts`)
SYSTEM_CHARS = (400, 1_600)  # a system prompt's passage, drawn uniformly in characters
SYSTEM_TEMPLATES = [
    "Explain what the following documentation describes and when someone would use it:\n\n{text}",
    "Summarise this documentation in three sentences:\n\n{text}",
    "What are the most important points in the following text? List them briefly.\n\n{text}",
    "Continue this documentation with the next paragraph:\n\n{text}",
    "Explain the following to someone who has never used a terminal:\n\n{text}",
]
MAN_PAGES = 400  # manual pages rendered for the corpus: a stable sample, at most MAN_FAMILY of one command family
MAN_FAMILY = 2  # e.g. the hundreds of `gcloud_*` pages of a cloud SDK count as one family
DOC_NAMES = ("README", "NEWS", "TODO", "FAQ", "USAGE")  # /usr/share/doc files taken as prose (not copyright files)


def _man_text(path: Path) -> str:
    """A manual page as plain text (`man -l`, 80 columns, no formatting); "" where it does not render."""
    import subprocess

    env = {**os.environ, "MANWIDTH": "80", "MAN_KEEP_FORMATTING": "", "LC_ALL": "C.UTF-8"}
    try:
        done = subprocess.run(["man", "--nh", "--nj", "-P", "cat", "-l", str(path)], capture_output=True, env=env,
                              timeout=20,
                              text=True, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def _doc_text(path: Path) -> str:
    import gzip

    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""
    return raw.decode("utf-8", errors="replace")


def system_documents(man_pages: int = MAN_PAGES, root: Path = Path("/usr/share")) -> list[tuple[str, str]]:
    """(source key, text) of the system's own prose: a stable sample of `man_pages` English manual pages (section
    1, 5 and 8: commands, file formats, administration) and the packages' READMEs and NEWS under `doc/`. Licence
    and copyright texts are not taken (they stay held out)."""
    families: dict[str, list[Path]] = {}
    for section in ("man1", "man5", "man8"):
        for page in sorted((root / "man" / section).glob("*")):
            family = families.setdefault(page.name.split(".")[0].split("_")[0].split("-")[0], [])
            if page.is_file() and len(family) < MAN_FAMILY:
                family.append(page)
    pages = sorted(p for family in families.values() for p in family)
    step = max(1, len(pages) // man_pages) if man_pages else 0
    docs = [(f"man:{p.name}", _man_text(p)) for p in (pages[::step][:man_pages] if step else [])]
    for path in sorted((root / "doc").glob("*/*")):
        name = path.name.upper()
        if path.is_file() and name.startswith(DOC_NAMES) and "COPYING" not in name and "LICEN" not in name:
            docs.append((f"doc:{path.parent.name}/{path.name}", _doc_text(path)))
    return [(key, text.strip()) for key, text in docs if len(text.strip()) >= SYSTEM_CHARS[0]]


def _system_prompt(rng: random.Random, docs: list[tuple[str, str]]) -> str:
    """A template around a passage of a system document: whole lines from the start of a random paragraph, about a
    length drawn from `SYSTEM_CHARS`."""
    lines = rng.choice(docs)[1].splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() and (i == 0 or not lines[i - 1].strip())]
    start, target, passage = rng.choice(starts), rng.randint(*SYSTEM_CHARS), ""  # a paragraph's first line
    for line in lines[start:]:
        if len(passage) >= target:
            break
        passage += line.rstrip() + "\n"
    if len(passage.strip()) < SYSTEM_CHARS[0]:  # too near the end: the document's end instead
        passage = "\n".join(lines)[-target:]
    return rng.choice(SYSTEM_TEMPLATES).format(text=passage.strip())


def system_prompts(train: int, evals: int, seed: int = 0, man_pages: int = MAN_PAGES) -> list[Prompt]:
    """`train` and `evals` prompts over the system's documentation (`SYSTEM_DOMAIN`); eval prompts come from
    held-out documents."""
    if not train and not evals:
        return []
    return document_prompts(SYSTEM_DOMAIN, system_documents(man_pages), _system_prompt, train, evals,
                            random.Random(seed + 3))


def write_corpus(out: Path, per_domain: int, eval_per_domain: int, text_chars: int, seed: int = 0,
                 parts: int = 1, long_train: int = 0, long_eval: int = 0, system_train: int = 0,
                 system_eval: int = 0) -> Path:
    """Write `prompts.jsonl` and `text.jsonl` under `out/corpus/` (skipped when already there), then append
    training-prompt parts 1 .. `parts` - 1 that are missing (`more_prompts`, `per_domain` each): the prompts already
    written, and so the answer shards already generated from them, never change. `long_train` and `long_eval`
    prompts over long documents (`long_prompts`) join the first corpus."""
    folder = out / "corpus"
    done = folder / "done.json"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        _write_prompts(folder, build_prompts(per_domain, eval_per_domain, seed)
                       + long_prompts(long_train, long_eval, seed) + system_prompts(system_train, system_eval, seed))
        with open(folder / "text.jsonl", "w") as f:
            for doc in build_text_documents(text_chars, seed):
                f.write(json.dumps(doc) + "\n")
        done.write_text(json.dumps({"prompts": len(read_prompts(folder)), "per_domain": per_domain,
                                    "eval_per_domain": eval_per_domain, "text_chars": text_chars, "seed": seed,
                                    "long_prompts": long_train, "long_eval": long_eval,
                                    "system_prompts": system_train, "system_eval": system_eval}))
    prompts = read_prompts(folder)
    for part in range(max(p.part for p in prompts) + 1, parts):
        prompts += more_prompts(prompts, per_domain, part, json.loads(done.read_text())["seed"])
        _write_prompts(folder, prompts)
    return folder


def _write_prompts(folder: Path, prompts: list[Prompt]) -> None:
    """All of `prompts` to `prompts.jsonl` at once (a stopped append leaves the previous file)."""
    tmp = folder / "prompts.jsonl.tmp"
    with open(tmp, "w") as f:
        for prompt in prompts:
            f.write(json.dumps(asdict(prompt)) + "\n")
    os.replace(tmp, folder / "prompts.jsonl")


def read_prompts(folder: Path, split: str | None = None, part: int | None = None) -> list[Prompt]:
    with open(folder / "prompts.jsonl") as f:
        prompts = [Prompt(**json.loads(line)) for line in f]
    return [p for p in prompts if (split is None or p.split == split) and (part is None or p.part == part)]


def read_documents(folder: Path) -> list[dict]:
    with open(folder / "text.jsonl") as f:
        return [json.loads(line) for line in f]
