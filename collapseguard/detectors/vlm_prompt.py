"""VisualQuality-R1's rating prompt and a strict parser for its answers (no torch needed).

The prompt follows the VisualQuality-R1 reference inference code (Wu et al., 2025,
arXiv:2505.14460, github.com/TianheWu/VisualQuality-R1): an overall rating from 1 to 5 with two
decimals, the final answer in ``<answer> </answer>`` tags; in thinking mode the model first reasons
inside ``<think> </think>`` tags. Unlike the reference code, an answer that cannot be parsed is
never replaced by a random rating: :func:`parse_rating` returns ``None`` and the judge reports NaN.
"""

from __future__ import annotations

import math
import re

QUESTION = (
    "You are doing the image quality assessment task. Here is the question: "
    "What is your overall rating on the quality of this picture? The rating should be a float "
    "between 1 and 5, rounded to two decimal places, with 1 representing very poor quality and 5 "
    "representing excellent quality."
)
FAST_SUFFIX = " Output the final answer with only one score in <answer> </answer> tags."
THINK_SUFFIX = (
    " First output the thinking process in <think> </think> tags and then output the final answer "
    "with only one score in <answer> </answer> tags."
)

#: lowest and highest rating the prompt asks for
RATING_MIN, RATING_MAX = 1.0, 5.0

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
#: anything a number could be read from, decimal commas and exponents included (then refused)
#: a number as a reader would take it, for counting and checking: a leading point (".5") and any
#: dash or plus sign before it belong to it, so neither turns a number outside [1, 5] into one inside
_NUMERIC = re.compile(r"[-+\u2010-\u2015\u2212\u02d7\u2796\ufe58\ufe63\uff0b\uff0d]?"
                      r"(?:\d+(?:[.,]\d+)*|[.,]\d+)(?:[eE][-+]?\d+)?")
_PLAIN = re.compile(r"[-+]?\d+(?:\.\d+)?")
#: text around the rating that holds numbers of its own: the scale ("1 to 5", "out of 5", "/5")
#: and the image label Qwen's chat template adds ("Picture 1:")
#: (the scale's "1" follows no digit, point or comma: "2.1 to 5" is no scale)
_SCALE = re.compile(r"(?:\bfrom\s+)?(?<![\d.,])\b1(?:\.0+)?\s*(?:to|-|–)\s*5(?:\.0+)?\b|(?:\bout\s+of|/)\s*5(?:\.0+)?\b"
                    r"|\bpicture\s+\d+\s*:", re.IGNORECASE)
_BARE_NUMBER = re.compile(r"\s*[-+]?\d+(?:\.\d+)?\s*")


def rating_prompt(thinking: bool = False) -> str:
    """The user text sent with the image (non-thinking 'fast' mode unless ``thinking``)."""
    return QUESTION + (THINK_SUFFIX if thinking else FAST_SUFFIX)


_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)


def _visible(text: str) -> str:
    """The reply without its reasoning: closed ``<think>`` blocks removed, and nothing after an
    unclosed ``<think>`` (the model ran out of tokens while still reasoning) or before a lone
    ``</think>`` (a template that opened the block in the prompt). An ``<answer>`` tag the model
    wrote while reasoning ("the format is <answer>5</answer>") is not its answer."""
    text = _THINK.sub(" ", text)
    text = _THINK_OPEN.split(text, maxsplit=1)[0]
    return _THINK_CLOSE.split(text)[-1]


def parse_rating(text: str) -> float | None:
    """Extract the 1..5 rating from a model answer, or ``None`` when it cannot be trusted.

    Rules: reasoning (``<think>`` blocks, closed or cut off) is set aside first; the content of the
    last ``<answer>...</answer>`` pair outside it is used; once the scale ("1 to
    5", "out of 5", "/5") and an image label ("Picture 1:") are set aside it must hold exactly one
    number, written plainly (no exponent, no decimal comma), in [1, 5]. Without answer tags, the
    reply (minus any ``<think>`` block) must be nothing but one number in [1, 5]. Anything else (no
    number, two numbers, out of range, NaN) is ``None``.
    """
    if not isinstance(text, str):
        return None
    text = _visible(text)
    answers = _ANSWER.findall(text)
    if answers:
        numbers = _NUMERIC.findall(_SCALE.sub(" ", answers[-1]))
        if len(numbers) != 1 or not _PLAIN.fullmatch(numbers[0]):
            return None
        value = float(numbers[0])
    else:
        rest = text
        if not _BARE_NUMBER.fullmatch(rest):
            return None
        value = float(rest)
    if not math.isfinite(value) or not (RATING_MIN <= value <= RATING_MAX):
        return None
    return value


def extract_reasoning(text: str) -> str:
    """The content of the last ``<think>`` block ('' when there is none)."""
    found = re.findall(r"<think>(.*?)</think>", text or "", re.DOTALL | re.IGNORECASE)
    return found[-1].strip() if found else ""
