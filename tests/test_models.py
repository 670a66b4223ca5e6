"""Model presets: a shipped drafter that is missing is one error naming the file, never a random stand-in."""

import json
from pathlib import Path

import pytest
import torch

from specdec import cli
from specdec import models as models_module
from specdec.models import (DEFAULT_TARGET, PRESETS, SHIPPED_DRAFTER_FILES, ModelLoadError, build_random_model,
                            load_model)

SHIPPED = [name for name, preset in PRESETS.items() if preset.folder]
CPU = torch.device("cpu")


def fake_assets(root: Path, missing: str | None) -> Path:
    """An assets/ folder whose shipped drafters hold every required file (as stubs) except `missing`."""
    for name in SHIPPED:
        folder = root / PRESETS[name].folder
        folder.mkdir(parents=True)
        for file in PRESETS[name].files:
            if file != missing:
                (folder / file).write_text("{}")
    return root


def test_the_shipped_drafters_are_presets_with_their_files():
    assert SHIPPED == ["mamba-smollm2", "mamba-feat-smollm2", "tf-smollm2", "xmamba-smollm2"]
    for name in SHIPPED:
        folder = models_module.ASSETS / PRESETS[name].folder
        expected = SHIPPED_DRAFTER_FILES if name != "xmamba-smollm2" else ("config.json", "model.safetensors",
                                                                          "tokenizer.json")  # its own tokenizer
        assert PRESETS[name].files == expected
        assert all((folder / file).is_file() for file in expected), folder


@pytest.mark.parametrize("name, missing", [(name, file) for name in SHIPPED for file in PRESETS[name].files])
def test_a_missing_file_of_a_shipped_drafter_is_named(monkeypatch, tmp_path, name, missing):
    monkeypatch.setattr(models_module, "ASSETS", fake_assets(tmp_path, missing))
    path = tmp_path / PRESETS[name].folder / missing
    with pytest.raises(ModelLoadError, match=f"preset '{name}' is missing {path}"):
        load_model(name, CPU, torch.float32, vocab_size=6)


@pytest.mark.parametrize("name", SHIPPED)
def test_a_missing_drafter_folder_is_named(monkeypatch, tmp_path, name):
    monkeypatch.setattr(models_module, "ASSETS", tmp_path)
    with pytest.raises(ModelLoadError, match=f"missing its folder {tmp_path / PRESETS[name].folder}"):
        load_model(name, CPU, torch.float32, vocab_size=6)


@pytest.mark.parametrize("name, model_type", [("random-mamba", "mamba"), ("random-tf", "llama")])
def test_random_drafters_only_by_name(name, model_type):
    loaded = load_model(name, CPU, torch.float32, vocab_size=6)
    assert loaded.model.config.model_type == model_type and loaded.vocab_size == 6
    assert loaded.source.startswith("random ") and loaded.tokenizer is None


@pytest.fixture
def no_drafters(monkeypatch, tmp_path, tiny_models):
    """The default presets with an empty assets/ folder; the default target is the tiny one (no 40 s load)."""
    real = models_module.load_model

    def load(spec, device, dtype, vocab_size=None, verified=True):
        return tiny_models.target if spec == DEFAULT_TARGET else real(spec, device, dtype, vocab_size, verified)

    monkeypatch.setattr(models_module, "load_model", load)
    monkeypatch.setattr(models_module, "ASSETS", tmp_path)
    return tmp_path


@pytest.mark.parametrize("method, preset", [("mamba-ucb", "mamba-smollm2"), ("tf-tree", "tf-smollm2")])
def test_the_cli_says_which_drafter_is_missing(no_drafters, capsys, method, preset):
    code = cli.main(["generate", "--prompt", "abc", "--method", method, "--lookup-branch", "6", "--device", "cpu",
                     "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: preset '{preset}' is missing its folder {no_drafters / 'drafters' / preset}; "
                      "restore the repository's assets/ folder or pass another model"]


def test_the_cpu_auto_dtype_follows_the_models_shapes_and_is_kept(monkeypatch, tmp_path):
    """`auto` decides which tokens greedy prints: bfloat16 only where it is exact for the model at hand (native bf16,
    packed bf16 linears of the model's shapes row-invariant), else float32. It is decided from the config, before
    the weights load, and the probe's answer is kept per machine, so a later process cannot flip it."""
    from specdec import probes
    from tests.tiny import tiny_llama

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    answers = {"native": True, torch.bfloat16: 1}
    calls = []
    monkeypatch.setattr(probes, "cpu_has_native_bf16", lambda: answers["native"])
    monkeypatch.setattr(probes, "probe_min_rows", lambda dtype, shapes: calls.append((dtype, shapes)) or answers[dtype])
    config = tiny_llama(11, seed=1).config
    assert models_module.resolve_dtype("auto", CPU) is None  # on a CPU, decided per model as it loads
    assert models_module.cpu_auto_dtype(config) == torch.bfloat16
    assert calls == [(torch.bfloat16, ((32, 32), (16, 32), (64, 32), (32, 64), (11, 32)))]
    answers[torch.bfloat16] = None
    assert models_module.cpu_auto_dtype(config) == torch.bfloat16 and len(calls) == 1  # kept: not probed again
    (tmp_path / "cpu-kernels.json").unlink()
    assert models_module.cpu_auto_dtype(config) == torch.float32  # this CPU's bf16 linears of these shapes fail
    answers.update({"native": False, torch.bfloat16: 1})
    (tmp_path / "cpu-kernels.json").unlink()
    assert models_module.cpu_auto_dtype(config) == torch.float32 and len(calls) == 2  # emulated bf16: not probed
    answers["native"] = True
    loaded = load_model("random-tf", CPU, None, vocab_size=6)  # `auto` as the loader takes it: from the config
    assert loaded.model.dtype == torch.bfloat16 and calls[-1][0] == torch.bfloat16 and calls[-1][1][-1] == (6, 64)


def test_an_embedding_kept_as_int8_rows_reads_back_within_half_a_step(tmp_path):
    """`save_int8_embedding` stores the (tied) embedding as int8 rows with a scale each: every value reads back
    within half a step of its row's scale, a zero row stays zero, the folder shrinks, the output layer stays
    tied, and a folder whose tensors do not fit its config is refused rather than filled with random weights."""
    from safetensors.torch import load_file, save_file

    model = build_random_model("mamba", 500).to(torch.bfloat16).eval()
    model.get_input_embeddings().weight.data[3] = 0
    model.save_pretrained(tmp_path)
    plain = (tmp_path / "model.safetensors").stat().st_size
    models_module.save_int8_embedding(model, tmp_path)
    embedding_bytes = model.get_input_embeddings().weight.numel() * 2
    assert plain - (tmp_path / "model.safetensors").stat().st_size > 0.45 * embedding_bytes  # bf16 -> int8 + scales
    loaded = models_module.read_folder_model(tmp_path, torch.float32)
    before, after = model.get_input_embeddings().weight.float(), loaded.get_input_embeddings().weight
    _, scale = models_module.quantize_rows(before)
    assert ((before - after).abs() <= scale / 2 + 1e-6).all() and not after[3].any() and (before != after).any()
    assert loaded.get_output_embeddings().weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    rest = [n for n, p in model.named_parameters() if p is not model.get_input_embeddings().weight]
    assert all(torch.equal(dict(model.named_parameters())[n].float(), dict(loaded.named_parameters())[n])
               for n in rest)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["backbone.extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected"):
        models_module.read_folder_model(tmp_path, torch.float32)


def test_a_converted_gguf_is_kept_exactly_and_read_back(monkeypatch, tmp_path):
    """The GGUF target is dequantised once and kept as float32 safetensors: what is read back is the same model
    (tied weights included), and `load_model` takes the kept folder instead of converting again."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    folder = tmp_path / "converted" / "tiny"
    models_module._keep_converted(model, None, folder)
    assert {p.name for p in folder.iterdir()} == {"config.json", "generation_config.json", "model.safetensors"}
    monkeypatch.setattr(models_module, "_converted_folder", lambda gguf: folder)
    loaded = load_model(DEFAULT_TARGET, CPU, torch.float32).model
    assert loaded.config.vocab_size == 40  # the kept folder was read, not the GGUF
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert loaded.get_output_embeddings().weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()


def test_a_gguf_asked_for_in_bfloat16_is_converted_once_in_float32_and_kept(monkeypatch, tmp_path):
    """The first load in any dtype dequantises in float32 and keeps the folder, so the next load of any dtype
    reads it instead of converting again; the model it returns is the kept one read in the dtype asked for."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    real, asked = models_module._from_pretrained, []

    def from_pretrained(source, gguf_file, dtype):
        asked.append((gguf_file is not None, dtype))
        return (model, None) if gguf_file else real(source, gguf_file, dtype)

    folder = tmp_path / "converted" / "tiny"
    monkeypatch.setattr(models_module, "_from_pretrained", from_pretrained)
    monkeypatch.setattr(models_module, "_converted_folder", lambda gguf: folder)
    loaded = load_model(DEFAULT_TARGET, CPU, torch.bfloat16).model
    assert asked == [(True, torch.float32), (False, torch.bfloat16)] and folder.is_dir()
    assert loaded.dtype == torch.bfloat16
    assert all(torch.equal(a.to(torch.bfloat16), b) for a, b in zip(model.state_dict().values(),
                                                                    loaded.state_dict().values()))
    load_model(DEFAULT_TARGET, CPU, torch.float32)
    assert asked[2:] == [(False, torch.float32)]  # kept: no second conversion


def test_the_converted_folder_follows_the_file_and_can_be_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"one")
    first = models_module._converted_folder(gguf)
    assert first.parent == tmp_path / "converted" and first.name.startswith("model-")
    gguf.write_bytes(b"other contents")  # a new file: a new folder, never a stale conversion
    assert models_module._converted_folder(gguf) != first
    monkeypatch.setenv("SPECDEC_GGUF_CACHE", "0")
    assert models_module._converted_folder(gguf) is None
