"""The models a run can name: presets built from configs with seeded random weights (no downloads).

Plain data, no torch: the command line lists them in its help and `e2eprof list` without importing a framework.
"""

from __future__ import annotations

from typing import Any

# Keyword arguments for transformers.AutoConfig.for_model: model_type picks the config class, anything not listed
# keeps that class's default (GPT-2: dropout 0.1, layer_norm_epsilon 1e-5, gelu_new, tied embeddings; Llama: silu,
# rope theta 10000, untied LM head; BERT: gelu, dropout 0.1, 2 token types). Parameter counts are of the model class
# that build_model uses (causal LM, or masked LM for encoders), tied weights counted once.
PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),  # 124.4M
    "gpt2-medium": dict(model_type="gpt2", n_layer=24, n_embd=1024, n_head=16, n_positions=1024,
                        vocab_size=50257),  # 354.8M params
    # For tests. bos/eos default to 50256, outside a 512-token vocabulary; transformers warns about that, so move them.
    "gpt2-tiny": dict(model_type="gpt2", n_layer=2, n_embd=64, n_head=4, n_positions=256, vocab_size=512,
                      bos_token_id=511, eos_token_id=511),
    # TinyLlama-1.1B's shape: 22 layers, grouped-query attention (32 query heads share 4 key/value heads).
    # 1,100,048,384 params, TinyLlama's count.
    "llama-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                     num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048, vocab_size=32000,
                     rms_norm_eps=1e-5),
    # For tests: same family, grouped-query attention kept (4 query heads, 2 key/value heads). 158,016 params.
    "llama-tiny": dict(model_type="llama", hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, vocab_size=512,
                       rms_norm_eps=1e-5),
    # BERT-base (uncased vocabulary size) with its masked-LM head. 109,514,298 params.
    "bert-base": dict(model_type="bert", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, max_position_embeddings=512, vocab_size=30522),
    # For tests: same family. 154,176 params.
    "bert-tiny": dict(model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=256, max_position_embeddings=256, vocab_size=512),
}
