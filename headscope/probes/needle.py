"""The needle-in-a-haystack probe: a sentence hidden in the bundled text, then a request to repeat it.

Each example is `[BOS] haystack[:cut] needle haystack[cut:] question answer`, where the haystack
is a window of the bundled natural text (`headscope.probes.base.text_corpus`, tokenised once as a
stream), the needle one of `NEEDLES` (sentences written for headscope), cut the first sentence
end at or after `depth` of the haystack, and the answer the needle's own token ids again (teacher
forcing: the model reads the right answer and is scored on predicting each of its tokens). The
needle and the answer are the same ids, so "the needle token that is being emitted" is exact.

- `NEEDLES`, `QUESTION`: the sentences and the prompt after the haystack.
- `needle_probe(tokenizer, lengths, depths, n_needles, seed, needles=NEEDLES, question=QUESTION)`
  -> list of `NeedleExample`.
- `NeedleExample`: input_ids `[pos]`, the needle and answer spans, length, depth, needle index;
  `.queries` are the positions whose next-token prediction is an answer token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import HeadscopeError, UsageError
from .base import special_tokens, text_corpus

__all__ = ["NEEDLES", "QUESTION", "NeedleExample", "needle_probe"]

# Written for headscope: specific, not guessable from the haystack, one sentence each.
NEEDLES = (
    "The secret ingredient in Olga Petrova's winter soup is a spoonful of roasted chestnut honey.",
    "The blue lighthouse on Marrow Island was painted by a retired astronomer named Felix Dunmore.",
    "The password for the old harbour archive is seventeen purple umbrellas and a silver kettle.",
    "Captain Ines Moreau hid the brass compass under the third step of the chapel stairs.",
    "The winning ticket in the Brackenford raffle was number four hundred and twelve, drawn by a goat.",
    "The best place to watch the autumn comets is the quiet hill behind the Kestrel Valley bakery.",
    "Professor Amara Quist keeps her spare glasses inside a green teapot on the library windowsill.",
    "The tallest sunflower in the Dunmere garden contest grew to nineteen feet and four inches.",
)
QUESTION = "\n\nQuestion: What is the special sentence hidden in the text above? Repeat it word for word.\nAnswer:"


@dataclass
class NeedleExample:
    """One needle prompt.

    Attributes:
        input_ids: `[pos]` the whole prompt, answer included (teacher forcing).
        needle: positions of the needle in the haystack.
        answer: positions of the answer (the needle's ids again), at the end of the prompt.
        length: tokens in the prompt (`len(input_ids)`).
        depth: where the needle was asked to go, as a share of the haystack (0 = start).
        needle_index: which of the needles (`NEEDLES` by default).
    """

    input_ids: torch.Tensor
    needle: slice
    answer: slice
    length: int
    depth: float
    needle_index: int

    @property
    def queries(self) -> torch.Tensor:
        """`[n_answer]` positions whose next-token prediction is an answer token (answer - 1)."""
        return torch.arange(self.answer.start - 1, self.answer.stop - 1)


def _sentence_ends(tokenizer, stream: list[int]) -> torch.Tensor:
    """Bool `[len(stream)]`: True after tokens that end with ".", "!" or "?" (a sentence end)."""
    pieces = tokenizer.convert_ids_to_tokens(sorted(set(stream)))
    ends = {i for i, p in zip(sorted(set(stream)), pieces) if p.rstrip().endswith((".", "!", "?"))}
    return torch.tensor([t in ends for t in stream])


def needle_probe(tokenizer, lengths: Sequence[int], depths: Sequence[float] = (0.1, 0.5, 0.9), n_needles: int = 1,
                 seed: int = 0, needles: Sequence[str] = NEEDLES, question: str = QUESTION) -> list[NeedleExample]:
    """Needle prompts of each length x depth x needle.

    Args:
        tokenizer: the model's tokenizer.
        lengths: total tokens per prompt (haystack, needle, question and answer together).
        depths: where the needle goes, as shares of the haystack in [0, 1].
        n_needles: needles per (length, depth): `needles[(seed + i) % len(needles)]`, i < n_needles.
        seed: picks the needles and where in the corpus each haystack window starts.
        needles, question: the sentences to hide and the request after the haystack (default
            `NEEDLES`, `QUESTION`; shorter ones fit models of short context).
    Returns:
        `len(lengths) * len(depths) * n_needles` examples, length-major.
    """
    if not 1 <= n_needles <= len(needles):
        raise HeadscopeError(f"n_needles must be between 1 and {len(needles)}, got {n_needles}")
    for depth in depths:
        if not 0.0 <= depth <= 1.0:
            raise HeadscopeError(f"needle depths are shares of the haystack in [0, 1], got {depth}")
    prefix, _ = special_tokens(tokenizer, bos=True)
    encode = lambda text: tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    stream = encode(text_corpus())
    ends = _sentence_ends(tokenizer, stream)
    question = encode(question)
    gen = torch.Generator().manual_seed(seed)
    examples = []
    for length in lengths:
        for depth in depths:
            for i in range(n_needles):
                index = (seed + i) % len(needles)
                needle = encode(" " + needles[index])
                answer = needle  # the same ids: the emitted token and the needle token match exactly
                n_hay = length - len(prefix) - len(needle) - len(question) - len(answer)
                if n_hay < 16:
                    raise UsageError(f"a needle prompt of {length} tokens leaves {n_hay} for the haystack; use >= "
                                         f"{length - n_hay + 16}")
                start = int(torch.randint(0, len(stream), (1,), generator=gen))
                window = (stream * (1 + (start + n_hay) // len(stream) + 1))[start:start + n_hay]  # wraps round
                window_ends = (ends.repeat(1 + (start + n_hay) // len(stream) + 1))[start:start + n_hay]
                cut = int(round(depth * n_hay))
                later = window_ends[cut:].nonzero()
                cut = min(n_hay, cut + int(later[0]) + 1) if len(later) and cut < n_hay else cut
                ids = prefix + window[:cut] + needle + window[cut:] + question + answer
                at = len(prefix) + cut
                examples.append(NeedleExample(
                    input_ids=torch.tensor(ids), needle=slice(at, at + len(needle)),
                    answer=slice(len(ids) - len(answer), len(ids)), length=len(ids), depth=float(depth),
                    needle_index=index))
    return examples
