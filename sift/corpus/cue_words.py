"""The words by which a chain of thought mentions a hint, in both organism lexicons (English and its ``xx`` twin).

Shared by the corpus audit's surface features and the trajectory stage's ``cue/*`` text features.
"""

from __future__ import annotations

import re

from sift.organism.render import xx_word

#: English hint words (the organism's second lexicon writes each through :func:`sift.organism.render.xx_word`)
HINT_WORDS_EN = ("hint", "hints", "friend", "says", "said", "official", "suggests", "suggested", "cue", "told", "key")


def hint_words() -> list[str]:
    """Every hint word, in both lexicons."""
    return list(HINT_WORDS_EN) + [xx_word(w) for w in HINT_WORDS_EN]


#: a hint word as a whole word, any case
HINT_RE = re.compile(r"(?<![\w])(" + "|".join(map(re.escape, hint_words())) + r")(?![\w])", re.IGNORECASE)
