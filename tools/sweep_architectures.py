"""Every MoE causal LM the installed transformers knows, built tiny with random weights, run
through the engine: does each load, and give transformers' own greedy tokens under every policy?

    .venv/bin/python tools/sweep_architectures.py [MODEL_TYPE ...]

The tests cover nineteen families by hand; this sweep is for a transformers upgrade, when new
architectures arrive. Each model type runs in a child process (a default config may be huge,
or crash), from its default config with the sizes below made small. Some architectures need
more than that (multi-head latent attention wants as many key-value heads as heads, hybrid
models a full-attention layer among their first layers, ZAYA1 one expert a token, DBRX its own
size names, Kolibri 1.1 layers that share their K/V, Qwen4-exp its indexer's sizes), so a few
variants are tried in turn until transformers itself can generate. One line per model type:

    same      the engine's tokens equal transformers' under full, lru, gate and seqmoe, and a
              chat's second turn on the first's kept KV cache replies as transformers does on its own; with
              the share of the chosen experts that the gate's look-ahead ranks in its top-k, given
              each layer's own input (under 100%: a router fed another input than its experts, state
              in the choice, or the wrong router), and how many prompt tokens the second turn reused
              (none: a cache that cannot be cut back, read afresh)
    DIFFERENT the policies whose tokens differ, or the second turn (a bug)
    refused   the engine's one-line reason (an MoE outside the experts interface)
    CRASH     the engine raised something other than its own refusal (a bug)
    not built transformers could not build or run the tiny model (a limit of this sweep)
    skipped   a multimodal config (its text model type is swept on its own)

With ``--dtype bfloat16`` the engine and transformers' reference load the models in bf16, so
the engine keeps the experts packed (``compression``): every bit must come back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seqmoe import Engine, Sampling

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = dict(
    vocab_size=128, unpadded_vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, moe_shared_expert_intermediate_size=32, expert_hidden_size=32,
    num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, max_position_embeddings=256, num_hidden_layers=3, num_experts=8, num_local_experts=8, n_routed_experts=8,
    moe_num_experts=8, num_experts_per_tok=2, num_experts_per_token=2, moe_topk=2, top_k=2, moe_k=2, n_group=2,
    num_expert_group=2, topk_group=1, n_shared_experts=1, num_shared_experts=1, first_k_dense_replace=1,
    num_dense_layers=1, kv_lora_rank=16, q_lora_rank=24,
    qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, index_head_dim=8, index_n_heads=2, index_topk=4,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
    mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, ssm_state_size=8, sliding_window=16,
    global_attn_every_n_layers=2, decoder_sparse_step=1, pad_token_id=0, bos_token_id=2, eos_token_id=1,
    enable_moe_block=True, top_k_experts=2,
    zero_expert_num=4,  # LongCat-Flash's skip choices, half as many as its experts (256 to 512 there)
)
VARIANTS = (
    {}, {"num_key_value_heads": 4}, {"num_hidden_layers": 4}, {"num_key_value_heads": 4, "num_hidden_layers": 4},
    {"num_hidden_layers": 8}, {"mamba_n_heads": 8, "layer_types": ["mamba", "attention", "mamba"]},
    {"layer_types": ["conv", "full_attention", "conv"]},
    {"num_experts_per_tok": 1},  # ZAYA1 routes one expert a token
    # linear-attention models whose first layers are all linear (Kimi Linear, Ling's hybrid)
    {"layer_types": "every kind"}, {"layer_types": "every kind", "num_key_value_heads": 4},
    # DBRX names its sizes its own way, the attention's and the experts' in nested configs
    {"d_model": 32, "n_heads": 4, "n_layers": 2,
     "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
     "ffn_config": {"ffn_hidden_size": 48, "moe_num_experts": 8, "moe_top_k": 2}},
    # Kolibri 1.1: indexed-attention layers that share their K/V, heads a multiple of 16 wide
    {"num_hidden_layers": 4, "head_dim": 16, "mlp_only_layers": [0], "index_layers": [1], "kv_source_layers": [0, 1, 2, 1],
     "layer_types": ["sliding_attention", "indexed_attention", "sliding_attention", "indexed_attention"],
     "index_pool_size": 16, "index_compression": 4, "index_num_heads": 2, "index_num_local_tokens": 4, "index_num_sink_tokens": 2},
    # Qwen4-exp: indexed-attention layers with an indexer of their own sizes among linear ones, n-gram embeddings
    {"layer_types": ["indexed_attention", "linear_attention", "indexed_attention"], "ngram_vocab_size_base": 256,
     "make_ngram_vocab_size_divisible_by": 8, "split_ngram_parts": 4, "indexer_n_heads": 2, "indexer_kv_heads": 1,
     "indexer_head_dim": 8, "indexer_budget": 4, "indexer_compress_ratio": 2, "hc_lowrank": 8},
)
POLICIES = (("full", 1.0), ("lru", 0.5), ("gate", 0.5), ("seqmoe", 0.5), ("lru", None))
"""Policy and cache ratio; ``None``: the smallest cache the model allows."""
NEW_TOKENS = 8


def moe_model_types() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from seqmoe.loader import EXPERT_COUNT_KEYS, declares_experts

    found = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = CONFIG_MAPPING[model_type]()
            # Also an expert count left unset by default: Gemma 4's MoE block is a switch.
            if declares_experts(config) or any(getattr(config, key, 0) is None for key in EXPERT_COUNT_KEYS):
                found.append(model_type)
        except Exception:  # a default config that cannot be built or read says nothing about the engine
            continue
    return found


def sweep_one(model_type: str, workdir: Path, dtype: str | None = None) -> dict[str, object]:
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from seqmoe import Engine, Sampling, load_model
    from seqmoe.errors import SeqMoEError
    from tests.core.conftest import build_model
    from tests.core.test_equivalence import PROMPT, reference_tokens

    transformers.utils.logging.set_verbosity_error()
    config_class = CONFIG_MAPPING[model_type]
    if "text_config" in config_class.sub_configs and set(config_class.sub_configs) - {"text_config"}:
        return {"result": "skipped", "why": "multimodal"}
    keys = config_class().to_dict()
    greedy = Sampling(max_new_tokens=NEW_TOKENS)
    problem = ""
    for number, variant in enumerate(VARIANTS):
        settings = {key: value for key, value in {**SMALL, **variant}.items() if key in keys}
        if variant.get("layer_types") == "every kind":
            # Each kind of layer of the default, in the order they first come, then the last again.
            every = list(dict.fromkeys(keys.get("layer_types") or []))
            if not every:
                continue
            settings["num_hidden_layers"] = max(len(every), settings["num_hidden_layers"])
            settings["layer_types"] = every + every[-1:] * (settings["num_hidden_layers"] - len(every))
        kinds = keys.get("mlp_layer_types")
        if isinstance(kinds, list) and kinds:
            # Cut from the default, a model this small would keep only the first layers' kind (Beam's
            # dense ones); the first kind, then the last (in the family's own names).
            settings["mlp_layer_types"] = kinds[:1] + kinds[-1:] * (settings["num_hidden_layers"] - 1)
        try:
            folder = build_model(workdir / f"{model_type}-{number}", config_class(**settings))
            expected = reference_tokens(folder, greedy, **({"dtype": getattr(torch, dtype)} if dtype else {}))
            break
        except Exception as error:  # the tiny model is this sweep's guess, not the architecture's fault
            problem = f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    else:
        return {"result": "not built", "why": problem}
    try:
        engine = Engine(load_model(str(folder), device="cpu", dtype=dtype))
    except SeqMoEError as error:
        return {"result": "refused", "why": str(error)}
    try:
        minimum = engine.geometry.minimum_slots / engine.geometry.total_experts
        different = []
        for policy, ratio in POLICIES:
            engine.configure(policy, cache_ratio=minimum if ratio is None else ratio)
            if engine.generate(PROMPT, greedy).token_ids != expected:
                different.append(f"{policy}@{minimum if ratio is None else ratio:.2f}")
        agreement = router_agreement(engine.loaded)
        same_turn, reused = second_turn(engine, greedy, folder, dtype)
        packed = engine.loaded.host.packed
        if not same_turn:
            different.append("a second turn on the kept context")
    except Exception as error:
        return {"result": "CRASH", "why": f"{type(error).__name__}: {error}"}
    finally:
        engine.close()
    if different:
        return {"result": "DIFFERENT", "why": ", ".join(different)}
    kept = f"the second turn reused {reused} prompt tokens" if reused else "the second turn read its prompt afresh"
    return {"result": "same", "why": f"the look-ahead's top-k holds {agreement:.0%} of the choice; {kept}"
                                     + ("; experts packed" if packed else "")}


def second_turn(engine: Engine, greedy: Sampling, folder: Path, dtype: str | None) -> tuple[bool, int]:
    """A chat's second turn on the first's kept KV cache (as the app sends it): whether its reply
    equals transformers' own reply on its cache of the first turn (or afresh, where the engine read
    it afresh), and how many of its prompt tokens the kept cache held. Not against a fresh prefill's
    reply: in bfloat16 a continued cache and a fresh prefill round differently, and a near tie
    between two tokens then splits transformers' own replies, as it did for glm4_moe."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.core.test_equivalence import PROMPT

    engine.configure("lru", cache_ratio=0.5)
    first = engine.generate(PROMPT, greedy, keep_context=True)
    prompt = PROMPT + first.token_ids + [9, 11, 13]
    kept = engine.generate(prompt, greedy, keep_context=True)
    model = AutoModelForCausalLM.from_pretrained(folder, **({"dtype": getattr(torch, dtype)} if dtype else {}))

    def reply(tokens: list[int], cache: object = None) -> tuple[list[int], object]:
        inputs = torch.tensor([tokens])
        output = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=greedy.max_new_tokens,
                                do_sample=False, top_k=None, pad_token_id=0, return_dict_in_generate=True,
                                **({"past_key_values": cache} if cache is not None else {}))
        return output.sequences[0, len(tokens):].tolist(), output.past_key_values

    reused = kept.stats.reused_prompt_tokens
    _, cache = reply(PROMPT)
    # A cache the engine cannot cut back is read afresh: so is transformers' reference then.
    return kept.token_ids == reply(prompt, cache if reused else None)[0], reused


def router_agreement(loaded: object) -> float:
    """The share of the experts chosen for the sweep's prompt that the gate policy's look-ahead
    (``router_logits``), given each layer's own input, ranks in its top-k."""
    import torch

    from seqmoe.routers import router_logits
    from tests.core.conftest import experts_inputs_and_choices
    from tests.core.test_equivalence import PROMPT

    hits = []
    for scores, (hidden, chosen) in zip(router_logits(loaded), experts_inputs_and_choices(loaded, PROMPT)):
        ranked = scores(hidden).topk(chosen.shape[-1], dim=-1).indices
        hits.append((chosen.long().unsqueeze(-1) == ranked.unsqueeze(-2)).any(-1).float().flatten())
    return torch.cat(hits).mean().item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_types", nargs="*", help="only these (default: every MoE causal LM)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per model type")
    parser.add_argument("--dtype", choices=["bfloat16"], help="load the engine and transformers' reference in this "
                                                                "dtype (bfloat16: the engine's experts packed)")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(sweep_one(args.one, args.workdir, args.dtype)))
        return 0
    bad = 0
    for model_type in args.model_types or moe_model_types():
        try:
            # The child's tiny checkpoints go, even when the timeout kills it.
            with tempfile.TemporaryDirectory(prefix="seqmoe-sweep-") as workdir:
                dtype = ["--dtype", args.dtype] if args.dtype else []
                child = subprocess.run([sys.executable, __file__, "--one", model_type, "--workdir", workdir, *dtype],
                                       capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
            lines = child.stdout.strip().splitlines()
            outcome = json.loads(lines[-1]) if child.returncode == 0 and lines else {
                "result": "CRASH", "why": f"exit status {child.returncode}: {child.stderr.strip()[-300:]}"}
        except subprocess.TimeoutExpired:
            outcome = {"result": "not built", "why": f"no result within {args.timeout} s (a large default config?)"}
        bad += outcome["result"] in ("DIFFERENT", "CRASH")
        print(f"{model_type:24} {outcome['result']:10} {outcome['why']}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
