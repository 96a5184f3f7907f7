"""Tiny random checkpoints of real transformers architectures, built in the tests (no hub)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from seqmoe.cli import main
from seqmoe.loader import LoadedModel
from seqmoe.routers import chosen_experts

os.environ["HF_HUB_OFFLINE"] = "1"
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VOCAB = 128
EOS = 1
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)

# Each family exercises a different layout or routing path of transformers' experts interface.
FAMILIES: dict[str, transformers.PretrainedConfig] = {
    "mixtral": transformers.MixtralConfig(
        **_COMMON, intermediate_size=48, num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=2
    ),
    "olmoe": transformers.OlmoeConfig(
        **_COMMON, intermediate_size=48, num_hidden_layers=3, num_experts=8, num_experts_per_tok=3, pad_token_id=0, eos_token_id=EOS
    ),
    # shared experts beside the routed ones
    "qwen2_moe": transformers.Qwen2MoeConfig(
        **_COMMON, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
    ),
    "qwen3_moe": transformers.Qwen3MoeConfig(
        **_COMMON, head_dim=8, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_experts=8,
        num_experts_per_tok=4, norm_topk_prob=True,
    ),
    # biased, transposed, interleaved gate/up experts with a clamped gate
    "gpt_oss": transformers.GptOssConfig(
        **_COMMON, head_dim=8, intermediate_size=32, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=16, layer_types=["sliding_attention", "full_attention"],
    ),
    # grouped routing (n_group / topk_group), shared experts and a dense first layer
    "deepseek_v3": transformers.DeepseekV3Config(
        **{**_COMMON, "num_key_value_heads": 4}, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3,
        n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1,
        kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8,
    ),
    # the router's weight inside a router module, a learned bias on the choice passed in by the block
    "afmoe": transformers.AfmoeConfig(
        **_COMMON, head_dim=8, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_dense_layers=1,
        num_experts=8, num_experts_per_tok=2, num_shared_experts=1, sliding_window=16, global_attn_every_n_layers=2,
    ),
    # a router whose forward takes the block's correction bias as an argument
    "minimax_m2": transformers.MiniMaxM2Config(
        **_COMMON, head_dim=8, intermediate_size=32, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
    ),
    "granitemoe": transformers.GraniteMoeConfig(
        **_COMMON, intermediate_size=48, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2
    ),
    # multi-head latent attention and shared experts (DeepSeek-V2-Lite of the catalog)
    "deepseek_v2": transformers.DeepseekV2Config(
        **{**_COMMON, "num_key_value_heads": 4}, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3,
        n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, n_shared_experts=1, kv_lora_rank=16,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, head_dim=8,
    ),
    # sparsemixer routing (Phi-3.5-MoE of the catalog)
    "phimoe": transformers.PhimoeConfig(
        **_COMMON, intermediate_size=48, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2
    ),
    # a dense MLP beside the MoE block in every layer, and the top-k under its own name (Gemma 4 26B-A4B)
    "gemma4": transformers.Gemma4TextConfig(
        **_COMMON, head_dim=8, intermediate_size=64, num_hidden_layers=2, enable_moe_block=True, num_experts=8,
        top_k_experts=2, moe_intermediate_size=32, hidden_size_per_layer_input=0, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
    ),
    # short-convolution layers with their own cache state among the attention ones (LFM2-8B-A1B)
    "lfm2_moe": transformers.Lfm2MoeConfig(
        **_COMMON, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_dense_layers=1,
        num_experts=8, num_experts_per_tok=2, layer_types=["conv", "full_attention", "conv"],
    ),
    # Mamba-2 layers beside attention, and a shared expert (Granite 4.0-H)
    "granitemoehybrid": transformers.GraniteMoeHybridConfig(
        **_COMMON, intermediate_size=48, shared_intermediate_size=32, num_hidden_layers=3, num_local_experts=8,
        num_experts_per_tok=2, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=8, mamba_d_head=8,
        mamba_n_groups=1, mamba_d_state=16, mamba_expand=2,
    ),
    # one expert a token, chosen by a router with a hidden layer of its own (ZAYA1)
    "zaya": transformers.ZayaConfig(
        **_COMMON, head_dim=8, moe_intermediate_size=32, num_hidden_layers=3, num_experts=8, num_experts_per_tok=1,
        router_hidden_size=16,
    ),
    # experts in every other layer only, beside Mamba layers (Jamba)
    "jamba": transformers.JambaConfig(
        **_COMMON, intermediate_size=48, num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, attn_layer_period=2,
        attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8,
        use_mamba_kernels=False,
    ),
    # the MoE as a layer of its own between Mamba-2 and attention layers (Nemotron-H)
    "nemotron_h": transformers.NemotronHConfig(
        **_COMMON, head_dim=8, intermediate_size=48, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
        num_hidden_layers=4, layers_block_type=["linear_attention", "moe", "full_attention", "moe"], n_routed_experts=8,
        num_experts_per_tok=2, n_group=1, topk_group=1, mamba_num_heads=8, mamba_head_dim=8, n_groups=1,
        ssm_state_size=16, chunk_size=16,
    ),
    # zero-computation experts (LongCat-Flash): the router also picks among skip choices, which reach
    # the experts as real experts with weight 0; the choice takes a correction bias
    "longcat_flash": transformers.LongcatFlashConfig(
        **{**_COMMON, "num_key_value_heads": 4}, num_layers=2, ffn_hidden_size=64, expert_ffn_hidden_size=64,
        n_routed_experts=8, zero_expert_num=4, moe_topk=2, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, head_dim=8,
    ),
    # linear-attention layers between full-attention ones, and a gated shared expert: no plain KV cache
    "qwen3_next": transformers.Qwen3NextConfig(
        **_COMMON, head_dim=8, intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8,
    ),
}


def layers_that_differ(narrow_heads: int | None = 2) -> transformers.PretrainedConfig:
    """A tiny dots3 MoE whose sliding-attention layers have ``narrow_heads`` heads, fewer than the
    first layer's 4 (transformers' per-layer config; ``None``: every layer alike)."""
    from transformers.models.dots3_note.configuration_dots3_note import Dots3NoteTextConfig

    narrow = {"num_attention_heads": narrow_heads, "num_key_value_heads": narrow_heads}
    return Dots3NoteTextConfig(
        **{**_COMMON, "num_key_value_heads": 4}, pad_token_id=0, head_dim=16, intermediate_size=64,
        moe_intermediate_size=32, shared_experts_intermediate_size=32, num_hidden_layers=3, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, index_head_dim=8, index_n_heads=2, index_topk=4, sliding_window=16,
        layer_types=["indexed_attention", "sliding_attention", "sliding_attention"],
        per_layer_config={1: narrow, 2: narrow} if narrow_heads else None,
    )


def save_tokenizer(folder: Path) -> None:
    """A character-level tokenizer with a chat template and EOS id 1."""
    vocab = {f"<{i}>": i for i in range(VOCAB)}
    vocab.update({chr(i): i for i in range(32, VOCAB - 1)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=f"<{EOS}>", unk_token="<0>", pad_token="<0>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def without_chat_template(source: Path, target: Path) -> Path:
    """A copy of the model at ``source`` whose tokenizer has no chat template."""
    shutil.copytree(source, target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def build_model(
    folder: Path, config: transformers.PretrainedConfig, seed: int = 0,
    make: Callable[[transformers.PretrainedConfig], nn.Module] = AutoModelForCausalLM.from_config,
) -> Path:
    """A random model of ``config`` with the test tokenizer; ``make`` builds it (a class for a model
    transformers does not file under causal LM)."""
    torch.manual_seed(seed)
    config.eos_token_id = EOS
    model = make(config)
    with torch.no_grad():
        for param in model.parameters():
            # Larger weights than the default init make routing and greedy choices decisive.
            param.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def experts_inputs_and_choices(loaded: LoadedModel, input_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each MoE layer's input and chosen experts in one forward pass over ``input_ids``, exactly as
    the block hands them to its experts (not the trace's float16 record: near ties must not flip)."""
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def capture(layer: int) -> Callable:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            seen[layer] = (hidden.clone(), chosen_experts(args, kwargs).clone())

        return hook

    handles = [e.register_forward_pre_hook(capture(layer), with_kwargs=True) for layer, e in enumerate(loaded.experts)]
    try:
        with torch.no_grad():
            loaded.model(input_ids=torch.tensor([input_ids]))
    finally:
        for handle in handles:
            handle.remove()
    return [seen[layer] for layer in range(len(loaded.experts))]


def store_experts_as_mxfp4(folder: Path, seed: int = 0) -> Path:
    """Rewrite a saved gpt-oss checkpoint's experts as openai/gpt-oss-20b ships them: MXFP4
    blocks (two 4-bit values a byte, 32 a block) and one power-of-two scale a block (random)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = tensor
            continue
        experts, inputs, outputs = tensor.shape
        shape = (experts, outputs, inputs // 32)
        tensors[f"{name}_blocks"] = torch.randint(0, 256, (*shape, 16), generator=generator, dtype=torch.uint8)
        tensors[f"{name}_scales"] = torch.randint(122, 128, shape, generator=generator, dtype=torch.uint8)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                     "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: build_model(root / name, config) for name, config in FAMILIES.items()}


CHAT_TEXT = "\n\n".join(
    f"hello there number {i}\nhi, how are you today?\nfine thanks, and you {i}?" for i in range(12)
)


@pytest.fixture(scope="session")
def traced(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model folder, trace folder) of the tiny Qwen3-MoE traced over a small chat text."""
    text = tmp_path_factory.mktemp("text") / "chat.txt"
    text.write_text(CHAT_TEXT)
    out = tmp_path_factory.mktemp("traces")
    model = tiny_models["qwen3_moe"]
    status = main(["trace", "--model", str(model), "--text", str(text), "--chat", "--continuation", "6",
                   "--out", str(out), "--device", "cpu"])
    assert status == 0
    return model, out


@pytest.fixture(scope="session")
def mixtral_dir(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["mixtral"]
