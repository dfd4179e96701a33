"""Conversations -> token ids plus an assistant-only loss mask, from the target's own chat template.

How the mask is found, without relying on `{% generation %}` markers (most templates have none):
render the conversation once as is and once with a unique placeholder in place of each assistant
content; putting the contents back into the placeholder rendering must give the real rendering,
and then the character span of every assistant content is known exactly (also when the same text
occurs in a header, a default system prompt or another turn, and when the template trims). For
templates that inspect contents (so the check fails), the contents are searched in order, left to
right. A token is trainable when it overlaps an assistant span (so a token that merges the
separator space with the first word, as in `assistant: Hi` -> ` Hi`, is trained, not lost). A template
that rewrites an assistant text beyond trimming makes the row fail with a reason, never a wrong mask.

Base models (no chat template) take plain-text rows instead: `{"text": ...}` trains on every token,
`{"prompt": ..., "completion": ...}` on the completion. Raw text is tokenized as the target's own
generation sees it: with the tokenizer's special-token rules (its BOS), which a chat template replaces
(templates write their own BOS, so templated text is tokenized without adding any).
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("system", "user", "assistant")
# ShareGPT speaker names -> OpenAI roles
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                  "assistant": "assistant", "chatgpt": "assistant", "bard": "assistant"}


class RowError(ValueError):
    """A row that cannot be used; the message is the reason shown in prepare_report.json."""


# --------------------------------------------------------------------------- row normalisation
def normalize_row(row) -> list[dict[str, str]] | dict[str, str]:
    """A row -> a conversation (list of {role, content}) or a completion ({"prompt", "completion"}).

    Conversations: OpenAI-style `messages` or ShareGPT-style `conversations`. Plain text: `text`
    (a completion with an empty prompt: every token trains) or `prompt` + `completion`."""
    if not isinstance(row, dict):
        raise RowError(f"row is not a JSON object but {type(row).__name__}")
    if "messages" in row:
        turns, role_key, text_key, names = row["messages"], "role", "content", None
    elif "conversations" in row:
        turns, role_key, text_key, names = row["conversations"], "from", "value", SHAREGPT_ROLES
    elif "text" in row or "completion" in row:
        return _normalize_completion(row)
    else:
        raise RowError(f"row has none of 'messages', 'conversations', 'text' or 'prompt'+'completion' "
                       f"(keys: {sorted(row)[:8]})")
    if not isinstance(turns, list) or not turns:
        raise RowError("conversation is empty or not a list")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise RowError(f"turn {i} is not an object")
        role = turn.get(role_key)
        role = names.get(role) if names and isinstance(role, str) else role
        if role not in ROLES:
            raise RowError(f"turn {i} has unknown role {turn.get(role_key)!r}")
        content = turn.get(text_key)
        if not isinstance(content, str):
            raise RowError(f"turn {i} content is not a string ({type(content).__name__})")
        if not content.strip():
            raise RowError(f"turn {i} ({role}) has empty content")
        if role == "system" and i != 0:
            raise RowError(f"turn {i} is a system turn that is not first")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise RowError("no assistant turn")
    if messages[-1]["role"] != "assistant":
        messages = messages[: max(i for i, m in enumerate(messages) if m["role"] == "assistant") + 1]
    return messages


def _normalize_completion(row: dict) -> dict[str, str]:
    prompt, completion = ("", row["text"]) if "text" in row else (row.get("prompt"), row["completion"])
    for key, value in (("prompt", prompt), ("completion" if "text" not in row else "text", completion)):
        if not isinstance(value, str):
            raise RowError(f"'{key}' is not a string ({type(value).__name__})" if value is not None
                           else "a 'completion' row needs a 'prompt' string too")
    if not completion.strip():
        raise RowError("the text to train on is empty")
    return {"prompt": prompt, "completion": completion}


def is_completion(record) -> bool:
    """True for plain-text records ({"prompt", "completion"}), False for conversations."""
    return isinstance(record, dict)


def resolve_chat_template(value: str | None, key: str = "--chat-template") -> str | None:
    """A chat template given as a Jinja string or as the path of a file holding one (None stays None)."""
    if not value:
        return None
    if "{%" in value or "{{" in value:
        return value
    from pathlib import Path

    from draftsmith.errors import DraftsmithError

    path = Path(value).expanduser()
    if not path.is_file():
        raise DraftsmithError(f"{key}: '{value}' is neither a Jinja chat template (no {{% or {{{{ in it) nor an "
                              "existing file holding one.")
    return path.read_text(encoding="utf-8")


def encode_prompt(tokenizer, prompt: list[dict[str, str]] | str, chat_template: str | None = None) -> list[int]:
    """Token ids a request starts from, as the target's own generation sees them: a conversation through
    the chat template with the generation prompt (no special tokens added: the template writes them),
    raw text with the tokenizer's special-token rules (its BOS, where it adds one)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    text = tokenizer.apply_chat_template(prompt, chat_template=chat_template, tokenize=False,
                                         add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------- template + mask
@dataclass
class Tokenized:
    """Token ids, the 0/1 loss mask and whether max_length cut the sequence."""

    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool = False


def render(tokenizer, messages: list[dict[str, str]], chat_template: str | None = None) -> str:
    """The conversation as text, exactly as the target's chat template writes it."""
    try:
        text = tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False)
    except Exception as err:  # templates raise (jinja `raise_exception`) on e.g. non-alternating roles
        raise RowError(f"the chat template refused this conversation ({type(err).__name__}: {err})") from err
    if not isinstance(text, str):  # some tokenizer versions wrap the text
        text = text[0] if isinstance(text, list) else str(text)
    return text


def assistant_spans(tokenizer, messages: list[dict[str, str]], text: str, last_turn_only: bool = False,
                    chat_template: str | None = None) -> list[tuple[int, int]]:
    """Character spans of the (trainable) assistant contents inside the rendered `text`."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    wanted = set(assistant[-1:] if last_turn_only else assistant)
    spans = _spans_by_placeholders(tokenizer, messages, text, assistant, chat_template)
    if spans is None:
        spans = _spans_by_search(text, messages)
    return [span for i, span in zip(assistant, spans) if i in wanted]


def _spans_by_placeholders(tokenizer, messages, text, assistant, chat_template):
    """Render with a unique placeholder per assistant content, then put the contents back.

    Unambiguous even when an assistant text also occurs in a header or an earlier turn. Works when
    the template copies contents verbatim or trimmed; returns None for templates that inspect them.
    """
    marks = {i: f"@@draftsmith-assistant-{i}@@" for i in assistant}
    probe = [dict(m, content=marks[i]) if i in marks else m for i, m in enumerate(messages)]
    rendered = render(tokenizer, probe, chat_template)
    for clean in (lambda c: c, str.strip):
        pieces, spans, cursor = [], [], 0
        for i in assistant:
            at = rendered.find(marks[i], cursor)
            if at < 0:
                return None
            pieces.append(rendered[cursor:at])
            start = sum(map(len, pieces))
            content = clean(messages[i]["content"])
            pieces.append(content)
            spans.append((start, start + len(content)))
            cursor = at + len(marks[i])
        pieces.append(rendered[cursor:])
        if "".join(pieces) == text:
            return spans
    return None


def _spans_by_search(text: str, messages: list[dict[str, str]]) -> list[tuple[int, int]]:
    """Fallback: find every message's content in order, left to right (contents may be trimmed)."""
    spans, cursor = [], 0
    for i, message in enumerate(messages):
        content = message["content"]
        start = text.find(content, cursor)
        if start < 0:
            content = content.strip()
            start = text.find(content, cursor)
        if start < 0:
            if message["role"] != "assistant":
                continue  # templates may drop or rewrite system/user text; nothing to train there
            raise RowError(f"the chat template changes the text of turn {i} (assistant), so its tokens cannot be located")
        if message["role"] == "assistant":
            spans.append((start, start + len(content)))
        cursor = start + len(content)
    return spans


def tokenize_record(tokenizer, record, max_length: int | None = None, last_turn_only: bool = False,
                    chat_template: str | None = None) -> Tokenized:
    """A normalised row (conversation or completion) -> ids and loss mask."""
    if is_completion(record):
        return tokenize_completion(tokenizer, record, max_length)
    return tokenize_conversation(tokenizer, record, max_length, last_turn_only, chat_template)


def tokenize_completion(tokenizer, record: dict[str, str], max_length: int | None = None) -> Tokenized:
    """prompt + completion (+ EOS) with the tokenizer's special-token rules; the completion and EOS train."""
    _require_fast(tokenizer)
    prompt, completion = record["prompt"], record["completion"]
    encoded = tokenizer(prompt + completion, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    special = set(tokenizer.all_special_ids)
    # A token trains when it ends inside the completion; special tokens the tokenizer adds (BOS) never do.
    mask = [int(end > len(prompt) and token not in special)
            for token, (_, end) in zip(ids, encoded["offset_mapping"])]
    eos = tokenizer.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)  # the target stops after the completion: the drafter learns that too
        mask.append(1)
    return _cut(ids, mask, max_length)


def _cut(ids: list[int], mask: list[int], max_length: int | None) -> Tokenized:
    truncated = max_length is not None and len(ids) > max_length
    if truncated:
        ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask):
        raise RowError("no trainable tokens" + (f" within max_length={max_length}" if truncated else ""))
    return Tokenized(ids, mask, truncated)


def _require_fast(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        from draftsmith.errors import DraftsmithError

        raise DraftsmithError("Loss masks need a fast (Rust) tokenizer with offset mappings; this target's "
                              f"tokenizer is {type(tokenizer).__name__}. Save the model with a tokenizer.json.")


def tokenize_conversation(
    tokenizer,
    messages: list[dict[str, str]],
    max_length: int | None = None,
    last_turn_only: bool = False,
    chat_template: str | None = None,
) -> Tokenized:
    """Apply the chat template, tokenize, and mark the assistant tokens as trainable."""
    text = render(tokenizer, messages, chat_template)
    spans = assistant_spans(tokenizer, messages, text, last_turn_only, chat_template)
    _require_fast(tokenizer)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    mask, span = [], 0
    for start, end in offsets:
        while span < len(spans) and start >= spans[span][1]:
            span += 1
        inside = span < len(spans) and start < spans[span][1] and end > spans[span][0]
        mask.append(int(inside))
    return _cut(ids, mask, max_length)
