"""Write the tiny test model: a random 2-layer llama, 64 wide, with a 259-token byte vocabulary
(3 control tokens + 256 byte tokens). It loads in milliseconds and answers ``/completion``.

Used by the tests' ``tiny_model`` fixture and by ``docs/hardware/llama_check.sh``::

    python3 tests/llamacpp/tiny_model.py /tmp/tiny.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path


def write_tiny_model(path: Path, context_length: int = 256) -> Path:
    """Write the model to ``path`` (same bytes every time: the weights use a fixed seed).
    ``context_length``: its training context, which caps what one request may generate."""
    import gguf
    import numpy as np

    n_vocab, n_embd, n_head, n_ff, n_layer = 259, 64, 4, 128, 2
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    kinds = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types(kinds + [gguf.TokenType.BYTE] * 256)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def ones(name: str) -> None:
        writer.add_tensor(name, np.ones(n_embd, dtype=np.float32))

    tensor("token_embd.weight", n_vocab, n_embd)
    ones("output_norm.weight")
    tensor("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        ones(f"blk.{i}.attn_norm.weight")
        ones(f"blk.{i}.ffn_norm.weight")
        for part in ("q", "k", "v", "output"):
            tensor(f"blk.{i}.attn_{part}.weight", n_embd, n_embd)
        tensor(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    print(write_tiny_model(Path(sys.argv[1])))
