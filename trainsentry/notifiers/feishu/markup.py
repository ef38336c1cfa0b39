"""Text the gateway did not write stays plain text in Feishu. Pure.

Labels, annotations, acknowledger names (the ack API's `by`, a console sign-in name, the
open_id of whoever pressed a card button), comments and roster names reach cards and
messages. In Feishu's card markdown (card JSON 2.0 `markdown` component, "Rich text") they
could otherwise form:
- mentions: `<at id=ou_...></at>`, `<at id=all></at>` (everyone in the group),
  `<at ids=ou_a,ou_b></at>`, `<at email=a@b></at>`;
- something clickable: `[text](url)`, `<a href='url'>text</a>`, `<a>url</a>`,
  `<link url='...'>text</link>`, images `![hover](img_key)`;
- look-alikes of the card's own parts: `<font color=...>`, `<text_tag>`, `<person>`, ...
Each starts with `<` or needs `[` and `]`: `escape_md` writes those (and `&`) as HTML
character references, which a markdown parser shows as the character and never reads as
syntax. A bare URL may still be shown as what it is; no text can hide one behind a label.

Feishu's text messages (`msg_type: text`, e.g. the direct message the Feishu phone provider
rings about) know `<at user_id="ou_..."></at>`, `<at user_id="all"></at>`, a few style tags
and `[text](url)`, and say nothing of character references: `escape_text` replaces `<`, `>`,
`[`, `]` with their full-width forms, so the words stay readable and form nothing.

Mentions are drawn only by `mention_markup`, for open_ids (`ou_...`): the ids that the
configuration or a roster gives (a TrainingJob's `owners`, resolved e-mail addresses).
Anything else passed as a mention, `all` included, is left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# A Feishu open_id as configured (a TrainingJob's owners, a roster's feishu_open_id).
OPEN_ID = re.compile(r"ou_[A-Za-z0-9_-]{1,64}")

_MD = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;"})
_TEXT = str.maketrans({"<": "\uff1c", ">": "\uff1e", "[": "\uff3b", "]": "\uff3d"})


def escape_md(text: str) -> str:
    """Pure: `text` as plain words inside a card's markdown: no mention, link, image or tag
    can form from it (the module docstring lists the forms)."""
    return text.translate(_MD)


def escape_text(text: str) -> str:
    """Pure: `text` for a Feishu text message: no `<at>` mention, tag or `[text](url)` link
    can form from it."""
    return text.translate(_TEXT)


def mention_markup(open_ids: Sequence[str]) -> str:
    """Pure: `<at id=...></at>` for each configured open_id; anything that is not one
    (`all`, a name, markup) is left out."""
    return " ".join(f"<at id={i}></at>" for i in open_ids if OPEN_ID.fullmatch(i))
