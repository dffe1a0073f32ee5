"""Tiny real models built offline from a config, for the judge tests: a Qwen2-VL / Qwen2.5-VL
folder with a real processor (a byte-level BPE tokenizer trained on the spot with Qwen's special
tokens and a Qwen-style chat template), and a RALI checkpoint in its published layout."""

from __future__ import annotations

import pickle

import numpy as np
import torch

from collapseguard.detectors.vlm_prompt import QUESTION

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]

# Qwen2-VL's chat template, reduced to what the judge uses (system turn, images, text, vision ids)
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [QUESTION, "<answer> 3.45 </answer> <think> The image is blurry and noisy. </think>"] * 3
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIALS[1:])


def build_tiny_qwen(folder, family: str):
    """Save a tiny random-weight Qwen2-VL or Qwen2.5-VL model + real processor into ``folder``."""
    import transformers
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor

    tok = _tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    video = transformers.Qwen2VLVideoProcessor() if hasattr(transformers, "Qwen2VLVideoProcessor") else None
    proc = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tok, video_processor=video,
                            chat_template=CHAT_TEMPLATE)
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], bos_token_id=None)
    common = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    if family == "qwen2_vl":
        cfg = transformers.Qwen2VLConfig(
            text_config=text, vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2),
            **common)
        cls = transformers.Qwen2VLForConditionalGeneration
    else:
        cfg = transformers.Qwen2_5_VLConfig(
            text_config=text, vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                 out_hidden_size=32, fullatt_block_indexes=[0], window_size=56),
            **common)
        cls = transformers.Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(0)
    cls(cfg).eval().save_pretrained(folder)
    proc.save_pretrained(folder)
    return folder


def _clip():
    from transformers import CLIPConfig, CLIPModel

    cfg = CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=99, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16,
    )
    torch.manual_seed(0)
    return CLIPModel(cfg).eval()


def make_rali_dir(root, bin_only=False):
    """Published RALI layout: best/ (CLIP), pca.pkl, basis.npz (vectors, scores), ckpt.pt."""
    from sklearn.decomposition import PCA
    from transformers import CLIPImageProcessor

    model = _clip()
    if bin_only:  # an older-style checkpoint: config + pickled torch weights, no safetensors
        model.config.save_pretrained(root / "best")
        torch.save(model.state_dict(), root / "best" / "pytorch_model.bin")
    else:
        model.save_pretrained(root / "best")
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(root / "best")
    rng = np.random.default_rng(0)
    pca = PCA(n_components=6, whiten=False).fit(rng.normal(size=(60, 16)) * np.linspace(3, 0.5, 16))
    with open(root / "pca.pkl", "wb") as fh:
        pickle.dump(pca, fh)
    np.savez(root / "basis.npz", vectors=rng.normal(size=(5, 6)), scores=np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    proj = model.visual_projection.weight.detach() * 1.5  # "fine-tuned" projection in the checkpoint
    torch.save({"state_dict": {"temperature": torch.tensor(0.5), "module.clip.visual_projection.weight": proj,
                               "head.unused": torch.ones(3)}, "epoch": 7}, root / "ckpt.pt")
    return root, proj, pca
