#!/usr/bin/env python3
"""Writes the test model: a llama-architecture GGUF small enough to run on any CPU.

    python3 tiny_gguf.py OUT.gguf        (needs the `gguf` package, pinned by real-model.sh)

The weights are random but seeded, so the same `gguf` version always writes the same bytes and
the same prompt always gets the same answer at temperature 0. What it says is noise; what it
exercises is real: llama.cpp's tokenizer (a SentencePiece-style vocabulary with byte fallback),
its transformer, its sampler, and its chat template handling.
"""
import sys

import gguf
import numpy as np

SEED = 20251202
LAYERS = 2
WIDTH = 128          # embedding length
HEADS = 4            # query heads; as many key/value heads
FEED_FORWARD = 256
CONTEXT = 2048       # tests fill a slot for a while with long generations

WORDS = (
    "hello world the a an and or to of in on at is are was be it this that you we they "
    "he she for with as by from say tell me what why how test user assistant system model "
    "answer question one two three yes no"
).split()

CHATML = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPACE = "\u2581"  # SentencePiece's word-start mark


def vocabulary():
    """(pieces, scores, types): control tokens, the 256 byte tokens, then text pieces.

    SentencePiece merges two pieces only into a piece that exists, so each word-start piece
    comes with every prefix of it; a higher score is a preferred merge.
    """
    pieces = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    pieces += ["<0x%02X>" % b for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    scores = [0.0] * len(pieces)

    text = [SPACE]
    text += [chr(c) for c in range(ord("a"), ord("z") + 1)]
    text += [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    text += list("0123456789.,;:!?'\"()-")
    for word in WORDS:
        marked = SPACE + word
        text += [marked[:n] for n in range(2, len(marked) + 1)]
    seen = set(pieces)
    for rank, piece in enumerate(dict.fromkeys(text)):
        if piece in seen:
            continue
        seen.add(piece)
        pieces.append(piece)
        types.append(gguf.TokenType.NORMAL)
        scores.append(-float(rank))
    return pieces, scores, types


def main(out):
    rng = np.random.default_rng(SEED)

    def weight(rows, cols):
        # numpy's (rows = outputs, cols = inputs); gguf stores it in ggml's reversed order.
        return (0.02 * rng.standard_normal((rows, cols))).astype(np.float32)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    pieces, scores, types = vocabulary()
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("hearth-test-tiny-llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(WIDTH)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FEED_FORWARD)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_rope_dimension_count(WIDTH // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(pieces))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types([int(t) for t in types])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML)

    vocab = len(pieces)
    w.add_tensor("token_embd.weight", weight(vocab, WIDTH))
    for layer in range(LAYERS):
        blk = "blk.%d." % layer
        w.add_tensor(blk + "attn_norm.weight", ones(WIDTH))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(blk + name + ".weight", weight(WIDTH, WIDTH))
        w.add_tensor(blk + "ffn_norm.weight", ones(WIDTH))
        w.add_tensor(blk + "ffn_gate.weight", weight(FEED_FORWARD, WIDTH))
        w.add_tensor(blk + "ffn_up.weight", weight(FEED_FORWARD, WIDTH))
        w.add_tensor(blk + "ffn_down.weight", weight(WIDTH, FEED_FORWARD))
    w.add_tensor("output_norm.weight", ones(WIDTH))
    w.add_tensor("output.weight", weight(vocab, WIDTH))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s: %d tokens, %d layers of width %d" % (out, vocab, LAYERS, WIDTH))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_gguf.py OUT.gguf")
    main(sys.argv[1])
