"""The VLM judge end to end on tiny Qwen2-VL / Qwen2.5-VL models built offline with random weights.

Each model folder is made in the test: config -> random weights -> save_pretrained, with a real
Qwen2VLProcessor (Qwen2VLImageProcessor + a byte-level BPE tokenizer trained on the spot with the
Qwen special tokens + a Qwen-style chat template), and loaded through the same path as a real
model folder (``create("vlm:<folder>")``).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch

from collapseguard.detectors import DetectorError, create
from collapseguard.detectors.vlm_prompt import (
    QUESTION,
    extract_reasoning,
    parse_rating,
    rating_prompt,
)

torch.set_num_threads(1)

from cg_models import build_tiny_qwen  # noqa: E402


def _force_processor(tokenizer, text: str):
    """A logits processor that makes the model emit ``text`` and then end its turn."""
    from transformers import LogitsProcessor, LogitsProcessorList

    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]

    class Force(LogitsProcessor):
        def __init__(self):
            self.start = None

        def __call__(self, input_ids, scores):
            if self.start is None:
                self.start = input_ids.shape[1]
            i = min(input_ids.shape[1] - self.start, len(ids) - 1)
            forced = torch.full_like(scores, float("-inf"))
            forced[:, ids[i]] = 0.0
            return forced

    return LogitsProcessorList([Force()])


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def model_dir(request, tmp_path_factory):
    return build_tiny_qwen(tmp_path_factory.mktemp(request.param), request.param)


def _images():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (40, 60, 3), dtype=np.uint8),
            rng.integers(0, 256, (90, 70, 3), dtype=np.uint8),
            np.full((56, 56, 3), 200, np.uint8)]


# ------------------------------------------------------------------------------------------------
# parser and prompt


@pytest.mark.parametrize("text,expected", [
    ("<answer>3.45</answer>", 3.45),
    ("<answer> 4 </answer>", 4.0),
    ("<think>noisy, blocky</think> <answer>2.10</answer>", 2.10),
    ("<answer>1.00</answer> then <answer>4.50</answer>", 4.50),  # the last answer counts
    ("<ANSWER>3.3</ANSWER>", 3.3),
    ("<answer>The rating is 3.75.</answer>", 3.75),  # a sentence's full stop is not a decimal
    ("<answer>1.2.3</answer>", None),
    ("<answer>rating: 3.75 out of 5</answer>", 3.75),
    ("<answer>Picture 1: 2.1</answer>", 2.1),  # the chat template labels the image "Picture 1:"
    ("<answer>On a scale of 1 to 5: 3.80</answer>", 3.80),
    ("<answer>4.25/5</answer>", 4.25),
    ("<answer>5.0e-1</answer>", None),  # an exponent is not how a rating is written
    ("<answer>4,25</answer>", None),  # a decimal comma: 4 or 4.25?
    ("<answer>3.5 or 4.0</answer>", None),  # two ratings
    ("3.20", 3.20),  # bare number, no tags
    ("<think>looks fine</think>4.10", 4.10),
])
def test_parse_well_formed(text, expected):
    got = parse_rating(text)
    assert (got is None) if expected is None else got == pytest.approx(expected)


@pytest.mark.parametrize("text", [
    "", "<answer></answer>", "<answer>great</answer>", "<answer>7.5</answer>", "<answer>0.3</answer>",
    "<answer>-2</answer>", "I would say 3.5", "<think>3.4</think>", "<answer>nan</answer>", "3.5 4.5",
    "<answer>3.45", None,
    "<answer>.5</answer>", "<answer>\u22123</answer>", "<answer>\uff0d3</answer>",
    "<answer>\u22123.5</answer>", "<answer>\u20133</answer>", "<answer>\u20103</answer>",
    "<answer>\u02d73</answer>", "<answer>\ufe583</answer>",  # 0.5 and other dashes: no rating in [1, 5]
    "<answer>2.1 to 5</answer>", "<answer>3.1-5</answer>", "<answer>4.1 - 5.0</answer>",
    "<answer>2,1 to 5</answer>",  # a range or a decimal comma, not the scale beside a rating
])
def test_parse_malformed_is_none(text):
    assert parse_rating(text) is None


def test_prompt_is_visualquality_r1s():
    fast, think = rating_prompt(False), rating_prompt(True)
    for p in (fast, think):
        assert p.startswith("You are doing the image quality assessment task.")
        assert "between 1 and 5, rounded to two decimal places" in p
        assert p.endswith("with only one score in <answer> </answer> tags.")
    assert "<think>" not in fast and "<think> </think>" in think
    assert extract_reasoning("<think> soft edges </think><answer>3</answer>") == "soft edges"


# ------------------------------------------------------------------------------------------------
# the whole judge path on tiny models


def test_random_weights_give_nan_and_counted_errors(model_dir):
    judge = create(f"vlm:{model_dir}", batch_size=2, max_new_tokens=8, device="cpu")
    assert judge.device == "cpu" and judge.model.dtype == torch.float32
    text = judge.chat_text()
    assert "Picture 1: <|vision_start|><|image_pad|><|vision_end|>" in text
    assert QUESTION in text and text.endswith("<|im_start|>assistant\n")
    out = judge.score_detailed(_images())
    assert set(out) == {"score", "raw"} and out["score"].shape == (3,)
    answers = list(judge.last_answers)
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)
    # garbage answers must be NaN, never a made-up rating; whatever parses must be in range
    parsed = [parse_rating(a) for a in answers]
    for p, s, r in zip(parsed, out["score"], out["raw"]):
        if p is None:
            assert np.isnan(s) and np.isnan(r)
        else:
            assert r == pytest.approx(p) and s == pytest.approx(5 - p)
    assert judge.n_parse_errors == sum(p is None for p in parsed) >= 1
    report = judge.error_report()
    assert report["scored"] == 3 and report["parse_errors"] == judge.n_parse_errors
    assert len(report["recent_unparseable_answers"]) == judge.n_parse_errors


def test_greedy_and_batching_are_deterministic(model_dir):
    judge = create(f"vlm:{model_dir}", batch_size=3, max_new_tokens=6, device="cpu")
    imgs = _images()
    batched = judge.generate(imgs)
    assert judge.generate(imgs) == batched  # greedy: same answers every time
    judge.batch_size = 1
    assert [judge.generate([im])[0] for im in imgs] == batched  # left padding does not leak


def test_forced_valid_answer_is_parsed_and_oriented(model_dir):
    probe = create(f"vlm:{model_dir}", device="cpu")
    lp = _force_processor(probe.processor.tokenizer, "<answer>3.45</answer>")
    judge = create(f"vlm:{model_dir}", device="cpu", batch_size=2, generation_kwargs={"logits_processor": lp})
    out = judge.score_detailed(_images()[:2])
    np.testing.assert_allclose(out["raw"], [3.45, 3.45], rtol=1e-6)
    np.testing.assert_allclose(out["score"], [5 - 3.45] * 2, rtol=1e-6)  # higher = more degraded
    assert judge.n_parse_errors == 0 and list(judge.last_answers)[-1] == "<answer>3.45</answer>"


def test_forced_malformed_answer_is_nan(model_dir):
    probe = create(f"vlm:{model_dir}", device="cpu")
    lp = _force_processor(probe.processor.tokenizer, "<answer>blurry</answer>")
    judge = create(f"vlm:{model_dir}", device="cpu", generation_kwargs={"logits_processor": lp})
    out = judge.score_detailed(_images()[:1])
    assert np.isnan(out["score"][0]) and judge.n_parse_errors == 1
    assert judge.error_report()["recent_unparseable_answers"] == ["<answer>blurry</answer>"]
    # a scoring table says why, not only that the judge "could not score the image"
    from collapseguard.images import encode_png
    from collapseguard.scoring.records import score_records

    [(_, res)] = list(score_records([[("a.png", encode_png(_images()[0]))]], judge))
    assert res.status == "score_error" and np.isnan(res.score)
    assert res.error == f"{judge.name}: no rating in [1, 5] in its answer '<answer>blurry</answer>'"


def test_thinking_mode(model_dir):
    probe = create(f"vlm:{model_dir}", device="cpu", thinking=True)
    assert "<think> </think>" in probe.chat_text() and probe.max_new_tokens == 1024
    assert probe.version != create(f"vlm:{model_dir}", device="cpu").version
    lp = _force_processor(probe.processor.tokenizer, "<think>blurry noise</think><answer>2.10</answer>")
    judge = create(f"vlm:{model_dir}", device="cpu", thinking=True, generation_kwargs={"logits_processor": lp})
    out = judge.score_detailed(_images()[:1])
    assert out["raw"][0] == pytest.approx(2.10) and out["score"][0] == pytest.approx(2.90)
    assert extract_reasoning(judge.last_answers[-1]) == "blurry noise"


def test_bad_specs_are_clear_errors(tmp_path):
    with pytest.raises(DetectorError, match="not found"):
        create(f"vlm:{tmp_path}/no/such/model")
    # a bare name that is no folder here is taken for a hub id (offline: not in the cache): one
    # line that says so, without the library's escaped newlines
    with pytest.raises(DetectorError, match="no folder 'nosuchdir' here either") as err:
        create("vlm:nosuchdir")
    assert "\\n" not in str(err.value) and "\n" not in str(err.value)
    from transformers import CLIPConfig

    CLIPConfig().save_pretrained(tmp_path)
    with pytest.raises(DetectorError, match="supports"):
        create(f"vlm:{tmp_path}")
    with pytest.raises(DetectorError, match="greedy"):
        create(f"vlm:{tmp_path}", generation_kwargs={"do_sample": True})


def test_images_go_in_at_native_resolution_up_to_max_pixels(model_dir):
    judge = create(f"vlm:{model_dir}", device="cpu")
    assert judge.grid == 28
    img = np.random.default_rng(5).integers(0, 256, (90, 70, 3), dtype=np.uint8)
    grid = judge.prepare([img])["image_grid_thw"][0].tolist()
    assert grid == [1, 84 // 14, 56 // 14]  # centre-cropped to 84 x 56, not resized
    n_tokens = int((judge.prepare([img])["input_ids"] == judge.processor.image_token_id).sum())
    assert n_tokens == 6 * 4 // 4  # one visual token per 2 x 2 merged patches
    capped = create(f"vlm:{model_dir}", device="cpu", max_pixels=56 * 56)
    _, h, w = capped.prepare([img])["image_grid_thw"][0].tolist()
    assert h * w * 14 * 14 <= 56 * 56 < 84 * 56
    assert capped.version != judge.version


def test_a_strip_too_long_for_the_processor_keeps_its_centre_and_is_scored(model_dir):
    judge = create(f"vlm:{model_dir}", device="cpu", max_new_tokens=4, batch_size=2)
    rng = np.random.default_rng(9)
    strip = rng.integers(0, 256, (28, 6000, 3), dtype=np.uint8)  # 214:1, Qwen's processor refuses it
    tall = rng.integers(0, 256, (7000, 30, 3), dtype=np.uint8)
    grid = judge.prepare([strip])["image_grid_thw"][0].tolist()
    assert grid[1] * 14 == 28 and grid[2] * 14 == 200 * 28  # the centre 28 x 5600, native pixels
    assert judge.score([strip, tall, _images()[0]]).shape == (3,)  # the batch is not lost


def test_local_version_follows_the_weights_not_only_their_sizes(model_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    before = create(f"vlm:{copy}", device="cpu").version
    assert before == create(f"vlm:{model_dir}", device="cpu").version  # same files, same version
    weights = next(copy.glob("*.safetensors"))
    tensors = load_file(weights)
    size = weights.stat().st_size
    save_file({k: v + 0.5 if v.is_floating_point() else v for k, v in tensors.items()}, weights,
              metadata={"format": "pt"})
    assert weights.stat().st_size == size  # a fine-tune: same names, shapes and bytes
    assert create(f"vlm:{copy}", device="cpu").version != before


@pytest.mark.parametrize("text", [
    "<think>The format is <answer>4.50</answer>, so let me look.</think>",  # an example, not the answer
    "<think>I could say <answer>4.9</answer> but the noise",  # cut off mid-reasoning
    "<think>maybe <answer>4.8</answer></think>",  # reasoning, then no answer at all
])
def test_an_answer_written_while_reasoning_is_not_the_answer(text):
    assert parse_rating(text) is None


@pytest.mark.parametrize("text,expected", [
    ("<think>Is it <answer>4.9</answer>? No: blocky.</think><answer>2.30</answer>", 2.30),
    ("blocky, noisy</think><answer>1.75</answer>", 1.75),  # the template opened <think> itself
    ("<think>a</think><think>b</think>3.3", 3.3),
])
def test_the_answer_after_the_reasoning_counts(text, expected):
    assert parse_rating(text) == pytest.approx(expected)


def test_the_precision_the_model_runs_in_is_part_of_the_version(model_dir):
    fp32 = create(f"vlm:{model_dir}", device="cpu")
    bf16 = create(f"vlm:{model_dir}", device="cpu", dtype="bfloat16")
    assert fp32.model.dtype == torch.float32 and bf16.model.dtype == torch.bfloat16
    assert bf16.version != fp32.version  # bf16 (the CUDA default) rates differently from fp32
    assert create(f"vlm:{model_dir}", device="cpu", dtype="float32").version == fp32.version


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_absent_gpu_is_a_clear_error(model_dir):
    with pytest.raises(DetectorError, match="CUDA is not available"):
        create(f"vlm:{model_dir}", device="cuda")
