"""Writes the tiny llama model that processors/inference/chat's tests serve.

No model weights can be downloaded here, and the tests only need a real server that
tokenizes, runs a forward pass, samples and reports token usage, so this script makes a
model of its own: llama architecture, 2 layers, 64-wide, random weights from a fixed
seed (the output is garbage text, and the same file on every run), with a
SentencePiece-style ("llama") vocabulary that byte-falls-back, so any UTF-8 text
tokenizes, and a ChatML chat template, so /v1/chat/completions formats messages from
the model's own metadata. The file is about 0.65 MB.

Usage: make_tiny_model.py --out tiny.gguf
"""

import argparse
import string

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 2  # grouped-query attention, as in current llama models
N_FF = 128
N_LAYER = 2
N_CTX_TRAIN = 2048
SEED = 20240601

SPACE = "\u2581"  # SentencePiece's word-boundary mark

# ChatML: messages as <|im_start|>role\ncontent<|im_end|>\n, then the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Words whose every prefix becomes a piece, so the tokenizer merges real multi-character
# tokens (and a longer prompt costs more than one token per word, but fewer than per byte).
WORDS = """the a an and of to in is was for on with as at by from that this it be are
patient patients note vital vitals heart rate blood pressure temperature oxygen
saturation summary hello world you your please answer short one word yes no ok
system user assistant care hub carehub""".split()


def vocabulary():
    """Returns (tokens, scores, types); ids 0, 1, 2 are <unk>, <s>, </s>."""
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL]
    for b in range(256):
        tokens.append("<0x%02X>" % b)
        types.append(T.BYTE)
    for special in ("<|im_start|>", "<|im_end|>"):
        tokens.append(special)
        types.append(T.CONTROL)
    pieces = [SPACE]
    pieces += list(string.ascii_letters + string.digits + string.punctuation)
    for w in WORDS:
        for n in range(1, len(w) + 1):
            pieces.append(SPACE + w[:n])
        for n in range(2, len(w) + 1):
            pieces.append(w[:n])
    seen = set(tokens)
    for p in pieces:
        if p not in seen:
            seen.add(p)
            tokens.append(p)
            types.append(T.NORMAL)
    # SentencePiece merges the pair whose result scores highest: prefer long pieces.
    scores = [0.0 if t != T.NORMAL else float(len(tok)) for tok, t in zip(tokens, types)]
    return tokens, scores, types


def weights(n_vocab, silent):
    """Returns the tensors by GGUF name; numpy shapes are (rows, cols) = (out, in)."""
    rng = np.random.default_rng(SEED)

    def rand(*shape, std=0.02):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    head_dim = N_EMBD // N_HEAD
    t = {"token_embd.weight": rand(n_vocab, N_EMBD, std=1.0)}
    for i in range(N_LAYER):
        p = "blk.%d." % i
        t[p + "attn_norm.weight"] = ones
        t[p + "attn_q.weight"] = rand(N_EMBD, N_EMBD)
        t[p + "attn_k.weight"] = rand(N_HEAD_KV * head_dim, N_EMBD)
        t[p + "attn_v.weight"] = rand(N_HEAD_KV * head_dim, N_EMBD)
        t[p + "attn_output.weight"] = rand(N_EMBD, N_EMBD)
        t[p + "ffn_norm.weight"] = ones
        t[p + "ffn_gate.weight"] = rand(N_FF, N_EMBD)
        t[p + "ffn_up.weight"] = rand(N_FF, N_EMBD)
        t[p + "ffn_down.weight"] = rand(N_EMBD, N_FF)
    t["output_norm.weight"] = ones
    out = rand(n_vocab, N_EMBD, std=0.5)
    # Zero logits for control and byte tokens: among hundreds of random logits the
    # best is far above 0, so greedy decoding never ends the turn early (completions
    # run to max_tokens) and never emits a lone byte of a multi-byte character.
    out[silent] = 0.0
    t["output.weight"] = out
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the .gguf file to write")
    args = ap.parse_args()

    tokens, scores, types = vocabulary()
    silent = [i for i, t in enumerate(types) if t != gguf.TokenType.NORMAL]

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("carehub-tiny-test")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))

    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(tokens.index("<|im_end|>"))  # ends the assistant's turn
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    for name, data in weights(len(tokens), silent).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
