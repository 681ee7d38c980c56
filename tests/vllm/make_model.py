#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write a tiny, randomly initialised Qwen2-VL model directory (no hub access).

    python make_model.py OUT_DIR [--seed N] [--poison-vision SEED]

OUT_DIR gets config.json, generation_config.json, model.safetensors, a byte-level
BPE tokenizer trained offline (tokenizer.json + tokenizer_config.json with
Qwen2-VL's special tokens), chat_template.jinja (Qwen2-VL's template) and
preprocessor_config.json (Qwen2-VL image processor pinned to 112x112 pixels, so
any image becomes 8x8 patches -> 16 embeddings of size --hidden after the 2x2
merger; vLLM's worker sees one float32 [16, 128] tensor per image).

--poison-vision SEED replaces every vision-tower weight (model.visual.*) with a
different random draw of the same shape; tokenizer, config and language model
stay byte-identical, so the poisoned model differs from the real one ONLY in
what its encoder produces.

Must run with a python that has torch, transformers, tokenizers, safetensors
(e.g. the vLLM venv from venv.sh).  Output is deterministic for given args.
"""
import argparse
import json
import os
import sys

SPECIAL_TOKENS = [  # Qwen2-VL's, in Qwen2-VL's order (ids are appended after the BPE vocab)
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]

# Qwen2-VL-Instruct's chat template (content lists: text / image / image_url / video).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WORDS = ("the a an of to in is it that this what which who where when why how "
         "image picture photo color colour red green blue yellow black white gray "
         "square circle stripe line left right top bottom center corner small large "
         "describe tell me you see show there are was were be has have with and or "
         "not one two three four five six seven eight nine ten cat dog car tree house "
         "sky sun water light dark bright pattern shape object scene system user "
         "assistant helpful answer question please thanks yes no maybe").split()


def corpus(n_lines=4000, seed=1234):
    import random
    rng = random.Random(seed)
    for _ in range(n_lines):
        k = rng.randint(4, 14)
        s = " ".join(rng.choice(WORDS) for _ in range(k))
        yield s.capitalize() + rng.choice([".", "?", "!", ",", ":"]) + " " + str(rng.randint(0, 99))


def build_tokenizer(out_dir, bpe_vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f, indent=2)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    return tok.get_vocab_size(), ids


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    ap.add_argument("--poison-vision", type=int, metavar="SEED", default=None,
                    help="redraw the vision tower's weights with this seed")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vision-depth", type=int, default=2)
    ap.add_argument("--vision-embed", type=int, default=64)
    ap.add_argument("--vision-heads", type=int, default=4)
    ap.add_argument("--bpe-vocab", type=int, default=1000)
    ap.add_argument("--init-std", type=float, default=0.02,
                    help="std of the random normal weights (transformers' initializer_range)")
    ap.add_argument("--image-side", type=int, default=112,
                    help="images are resized to ~side*side pixels: (side/28)^2 embeddings")
    args = ap.parse_args(argv)

    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    out = args.out_dir
    os.makedirs(out, exist_ok=True)
    vocab, ids = build_tokenizer(out, args.bpe_vocab)

    head_dim = args.hidden // args.heads
    assert head_dim % 8 == 0, "text head_dim must be a multiple of 8 (mrope sections)"
    half = head_dim // 2
    t = half // 4
    mrope = [t, (half - t) // 2, half - t - (half - t) // 2]  # e.g. [4, 6, 6] for head_dim 32

    text = dict(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=4096,
        rms_norm_eps=1e-6, initializer_range=args.init_std,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                         "mrope_section": mrope},
        use_sliding_window=False, max_window_layers=args.layers,
    )
    vision = dict(
        depth=args.vision_depth, embed_dim=args.vision_embed, hidden_size=args.hidden,
        num_heads=args.vision_heads, mlp_ratio=2, in_channels=3, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, initializer_range=args.init_std,
    )
    cfg = Qwen2VLConfig(
        text_config=text, vision_config=vision,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    cfg.architectures = ["Qwen2VLForConditionalGeneration"]

    def draw(seed):
        torch.manual_seed(seed)
        m = Qwen2VLForConditionalGeneration(cfg).to(torch.float32).eval()
        return {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}

    sd = draw(args.seed)
    n_vis = sum(1 for k in sd if ".visual." in k or k.startswith("visual."))
    if n_vis == 0:
        sys.exit("make_model: found no vision-tower weights (model.visual.*)")
    if args.poison_vision is not None:
        if args.poison_vision == args.seed:
            sys.exit("make_model: --poison-vision SEED must differ from --seed")
        other = draw(args.poison_vision)
        for k in sd:
            if ".visual." in k or k.startswith("visual."):
                sd[k] = other[k]

    # vLLM takes the dtype from config; float32 because this is for CPU tests.
    cfg.dtype = "float32"
    cfg.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        cj = json.load(f)
    cj["torch_dtype"] = "float32"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cj, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": ids["<|endoftext|>"],
                   "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                   "pad_token_id": ids["<|endoftext|>"], "do_sample": False}, f, indent=2)
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    px = args.image_side * args.image_side
    pre = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "resample": 3, "rescale_factor": 1 / 255,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "min_pixels": px, "max_pixels": px,
        "size": {"shortest_edge": px, "longest_edge": px},
        "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    }
    with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f, indent=2)
    # The video processor is loaded by Qwen2VLProcessor too; keep it as small.
    vpre = dict(pre, video_processor_type="Qwen2VLVideoProcessor")
    vpre.pop("image_processor_type")
    with open(os.path.join(out, "video_preprocessor_config.json"), "w") as f:
        json.dump(vpre, f, indent=2)

    n_params = sum(v.numel() for v in sd.values())
    print(json.dumps({"out_dir": os.path.abspath(out), "seed": args.seed,
                      "poison_vision": args.poison_vision, "vocab": vocab,
                      "image_token_id": ids["<|image_pad|>"], "params": n_params,
                      "vision_tensors": n_vis,
                      "embeds_per_image": (args.image_side // 28) ** 2,
                      "hidden": args.hidden}))


if __name__ == "__main__":
    main()
