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
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?!\w)(?!\.\d)")
_BARE_NUMBER = re.compile(r"\s*[-+]?\d+(?:\.\d+)?\s*")


def rating_prompt(thinking: bool = False) -> str:
    """The user text sent with the image (non-thinking 'fast' mode unless ``thinking``)."""
    return QUESTION + (THINK_SUFFIX if thinking else FAST_SUFFIX)


def parse_rating(text: str) -> float | None:
    """Extract the 1..5 rating from a model answer, or ``None`` when it cannot be trusted.

    Rules: the content of the last ``<answer>...</answer>`` pair is used, and its first number
    must lie in [1, 5]. Without answer tags, the reply (minus any ``<think>`` block) must be
    nothing but one number in [1, 5]. Anything else (no number, out of range, NaN) is ``None``.
    """
    if not isinstance(text, str):
        return None
    answers = _ANSWER.findall(text)
    if answers:
        m = _NUMBER.search(answers[-1])
        if m is None:
            return None
        value = float(m.group())
    else:
        rest = _THINK.sub("", text)
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
