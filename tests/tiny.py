"""Tiny random targets and a byte-level tokenizer, built in memory for fast unit tests."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from draftsmith.target import Target

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_level_core(specials: dict[str, int]) -> Tokenizer:
    """A byte-level BPE without merges over the 256 bytes (ids 0..255) plus `specials` (name -> id)."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update(specials)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return core


def byte_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """256 byte tokens plus ChatML specials (ids 256..258): any text round-trips exactly."""
    core = byte_level_core({special: 256 + offset for offset, special in enumerate(SPECIAL_TOKENS)})
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


BOS = "<|startoftext|>"


def base_tokenizer() -> PreTrainedTokenizerFast:
    """A base model's tokenizer: the 256 bytes, no chat template, and a BOS (id 259) that it adds in front
    of every text, as Llama/Gemma-style tokenizers do; EOS is <|endoftext|> (256)."""
    core = byte_level_core({"<|endoftext|>": 256, BOS: 259})
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                        special_tokens=[(BOS, 259)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def tiny_config(arch: str = "llama", vocab_size: int = 320, hidden_size: int = 64, num_layers: int = 8, **extra):
    """A small config of a real architecture (llama, qwen3, mistral, qwen2)."""
    from transformers import AutoConfig

    base = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=False,
        pad_token_id=256, eos_token_id=258, bos_token_id=257,
    )
    if arch == "qwen3":
        base["head_dim"] = hidden_size // 4
    base.update(extra)
    return AutoConfig.for_model(arch, **base)


def tiny_model(arch: str = "llama", seed: int = 0, **kwargs) -> torch.nn.Module:
    """A random causal LM of the given architecture, in float32, eval mode."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **kwargs), dtype=torch.float32)
    return model.eval()


def tiny_target(arch: str = "llama", seed: int = 0, **kwargs) -> Target:
    """A Target around a tiny random model with the byte tokenizer and a ChatML template."""
    return Target(tiny_model(arch, seed=seed, **kwargs), byte_tokenizer(), name=f"tiny-{arch}")


def save_target(target: Target, folder) -> str:
    """Write a tiny target as a model folder (what users point draftsmith at); returns its path."""
    target.model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    return str(folder)
