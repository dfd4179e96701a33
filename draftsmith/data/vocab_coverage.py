"""Held-out coverage of a draft vocabulary: the share of the target's own answer tokens to prompts the vocabulary was
not built from that it holds, per category and overall, and the size `prepare.draft_vocab_size: auto` picks from it.

A drafter drafts only inside its vocabulary, so a token the target says outside it is a rejection whatever the
drafter learned. Coverage measured on the training split says nothing (a small split reads 1.0 at its own distinct
count); what counts is the target's answers to new prompts of every category. Those come from the held-out prompt
sets (builtin:suite and builtin:handwritten by default: the first few rows of each category, answered greedily by
the target for a few dozen tokens, batched with regeneration's loop) and from the prepared eval split (its answers
where they are the target's own, regenerated; otherwise the target's greedy continuation of each eval row's prompt).
Sizes follow build_draft_vocab's order (count descending, lower id first), so coverage at size N is the share of
answer tokens whose rank in the training counts is below N.
"""

from __future__ import annotations

import torch

from draftsmith.errors import DraftsmithError

LADDER = (1024, 2048, 4096, 8192, 16384, 32768)
"""the sizes `auto` chooses among (capped by the distinct trainable tokens of the training split)"""


# --------------------------------------------------------------------------- coverage from counts
def token_ranks(token_counts: torch.Tensor) -> torch.Tensor:
    """Rank of each token id in build_draft_vocab's order (count descending, lower id first); a token the training
    split never holds ranks at the vocabulary size, outside every draft vocabulary."""
    counts = token_counts.long()
    order = torch.sort(-counts, stable=True).indices
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(len(counts))
    ranks[counts == 0] = len(counts)
    return ranks


def coverage_at(ranks: torch.Tensor, answers: dict[str, torch.Tensor], size: int) -> dict:
    """Share of answer tokens a vocabulary of the top `size` tokens holds: overall (tokens pooled) and per category."""
    held = {name: (ranks[tokens] < size) for name, tokens in answers.items() if len(tokens)}
    pooled = torch.cat(list(held.values())) if held else torch.zeros(0, dtype=torch.bool)
    return {"size": size, "overall": _share(pooled),
            "per_category": {name: _share(inside) for name, inside in sorted(held.items())}}


def _share(inside: torch.Tensor) -> float | None:
    return round(float(inside.float().mean()), 4) if len(inside) else None


def ladder_sizes(distinct: int, ladder=LADDER) -> list[int]:
    """The ladder's sizes the training split can fill, and its distinct count when that falls short of the top."""
    sizes = [size for size in ladder if size <= distinct]
    return sizes + [distinct] if distinct < max(ladder) and distinct not in sizes and distinct > 0 else sizes


def coverage_curve(token_counts: torch.Tensor, answers: dict[str, torch.Tensor], sizes: list[int]) -> list[dict]:
    """Coverage of `answers` at each of `sizes`, for vocabularies built from `token_counts`."""
    ranks = token_ranks(token_counts)
    return [coverage_at(ranks, answers, size) for size in sizes]


def choose_size(curve: list[dict], coverage_target: float) -> tuple[int, str]:
    """The smallest size whose coverage reaches `coverage_target` in every category, and why; the largest size of
    the curve when none does."""
    def worst(point):
        shares = {name: share for name, share in point["per_category"].items() if share is not None}
        name = min(shares, key=shares.get)
        return name, shares[name]

    for index, point in enumerate(curve):
        name, share = worst(point)
        if share >= coverage_target:
            why = (f"the smallest size whose held-out coverage reaches {coverage_target} in every category "
                   f"(lowest: {name} at {share})")
            if index:  # what the size below it lacked
                below, below_share = worst(curve[index - 1])
                why += f"; {curve[index - 1]['size']} reaches {below_share} in {below}"
            return point["size"], why
    name, share = worst(curve[-1])
    return curve[-1]["size"], (f"no size the training split can fill reaches {coverage_target} in every category: "
                               f"the largest, {curve[-1]['size']}, reaches {share} in its lowest ({name}); more or "
                               "broader training data gives a larger one")


# --------------------------------------------------------------------------- the target's answers
def prompt_set_answers(target, prompt_sets: list[str], per_category: int, max_new_tokens: int, batch_size: int,
                       chat_template: str | None = None) -> dict[str, torch.Tensor]:
    """The target's greedy answers (at most `max_new_tokens` tokens, EOS left out) to the first `per_category`
    rows of each category of each prompt set, pooled by category (a row without one counts under its set's name)."""
    from draftsmith.data.prompt_reader import read_prompt_rows
    from draftsmith.data.templates import encode_prompt

    chosen, taken = [], {}
    for prompt_set in prompt_sets:
        for row in read_prompt_rows(prompt_set):
            category = row.category or prompt_set
            if taken.get((prompt_set, category), 0) < per_category:
                taken[(prompt_set, category)] = taken.get((prompt_set, category), 0) + 1
                use_chat = chat_template or target.has_chat_template
                prompt = row.messages if use_chat else row.messages[0]["content"]
                chosen.append((category, encode_prompt(target.tokenizer, prompt, chat_template)))
    return _pooled(target, chosen, max_new_tokens, batch_size)


def eval_split_answers(target, split, regenerated: bool, max_new_tokens: int, batch_size: int,
                       max_rows: int) -> dict[str, torch.Tensor]:
    """Answer tokens of the prepared eval split by input (`eval:SOURCE`): its loss-masked tokens where they are the
    target's own (regenerated); otherwise the target's greedy continuation of the first `max_rows` rows' prompts
    (the tokens before the last trainable span; for plain text, its first 32 tokens)."""
    if regenerated:
        pooled: dict[str, list[torch.Tensor]] = {}
        for ids, mask, source in zip(split["input_ids"], split["loss_mask"], split["source"]):
            pooled.setdefault(f"eval:{source}", []).append(torch.tensor(ids)[torch.tensor(mask, dtype=torch.bool)])
        return {name: torch.cat(parts) for name, parts in pooled.items()}
    chosen = []
    for ids, mask, source in list(zip(split["input_ids"], split["loss_mask"], split["source"]))[:max_rows]:
        start = _last_span_start(mask)
        chosen.append((f"eval:{source}", list(ids[:start] if start > 0 else ids[:32])))
    return _pooled(target, chosen, max_new_tokens, batch_size)


def _last_span_start(mask: list[int]) -> int:
    """Index where the last run of trainable (1) positions begins; 0 when there is none or it starts the row."""
    end = max((i for i, m in enumerate(mask) if m), default=-1)
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return max(start, 0)


def _pooled(target, chosen: list[tuple[str, list[int]]], max_new_tokens: int,
            batch_size: int) -> dict[str, torch.Tensor]:
    """Greedy answers to prompts given as token ids, batched by regeneration's loop, pooled by their label."""
    from draftsmith.data.regenerate import write_tokens

    eos = target.tokenizer.eos_token_id
    pooled: dict[str, list[int]] = {}
    for begin in range(0, len(chosen), batch_size):
        batch = chosen[begin:begin + batch_size]
        for (label, _), written in zip(batch, write_tokens(target, [ids for _, ids in batch], 0.0, max_new_tokens)):
            pooled.setdefault(label, []).extend(token for token in written if token != eos)
    return {label: torch.tensor(tokens, dtype=torch.long) for label, tokens in pooled.items()}


def held_out_report(token_counts: torch.Tensor, prompt_answers: dict[str, torch.Tensor],
                    eval_answers: dict[str, torch.Tensor], requested, coverage_target: float) -> tuple[int, dict]:
    """The draft vocabulary's size for `requested` ("auto" or a token count, capped by the training split's
    distinct tokens) and the report of held-out coverage: the curve over the ladder (and the requested size), the
    size and why; coverage of the prompt sets' categories decides, the eval split's inputs are shown beside them."""
    distinct = int((token_counts > 0).sum())
    if not distinct:
        raise DraftsmithError("The training split holds no trainable token, so no draft vocabulary can be built: "
                              "check the inputs' assistant turns (or set --draft-vocab-size 0).")
    sizes = ladder_sizes(distinct)
    if requested != "auto":
        sizes = sorted(set(sizes) | {min(int(requested), distinct)})
    answers = {**prompt_answers, **eval_answers}
    curve = coverage_curve(token_counts, answers, sizes) if answers else []
    decided = [{**point, "per_category": {k: v for k, v in point["per_category"].items() if k in prompt_answers}}
               for point in curve]
    if requested == "auto":  # PrepareConfig.validate makes sure prompt sets were answered
        size, why = choose_size(decided, coverage_target)
    else:
        size = min(int(requested), distinct)
        why = "asked for" if size == int(requested) else \
            f"asked for {requested}; the training split holds only {distinct} distinct trainable tokens"
    chosen = next((point for point in curve if point["size"] == size), None)
    return size, {"coverage_target": coverage_target, "size": size, "why": why,
                  "coverage": chosen["overall"] if chosen else None,
                  "answer_tokens": {name: len(tokens) for name, tokens in sorted(answers.items())},
                  "curve": curve}
