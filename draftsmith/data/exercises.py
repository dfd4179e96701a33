"""`builtin:exercises`: small typed Python exercises in the shape of a code benchmark's prompts.

A prompt is what HumanEval-style benchmarks hand a model: `from typing import ...` where needed,
then a typed `def` line and a docstring that states the task and shows worked examples, either
as doctest lines (`>>> f(x)` then the result) or as `f(x) == result` after "For example:". The
answer is a reference implementation. Meant for regeneration (prepare.regenerate): the target
writes the answers, and a drafter trained on them sees what the target does with such a prompt,
which is mostly to repeat the signature, write a body and then call it on the examples.

The exercises come from a fixed list of tasks (filters and folds over integer lists, list
transforms, string tasks, integer arithmetic), each with several names and parameter names. The
examples are computed by running the reference implementation on seeded random inputs, so every
shown result is true. Nothing is taken from any benchmark, and tasks that are the same as a
HumanEval problem (primes, Fibonacci, gcd, medians, palindromes, vowel removal, ...) are left out,
as are HumanEval's function names: HumanEval is what the drafters are measured on. A few tasks
cover part of one (spaces to underscores is half of `fix_spaces`, `all_less_than_k` is
`below_threshold` at a fixed threshold). The same version always writes the same file, in a fixed
seeded order.
"""

from __future__ import annotations

import random
import re
import textwrap
from dataclasses import dataclass

VERSION = "v1"
WORDS = ("apple", "banana", "cherry", "delta", "echo", "forest", "garden", "harbor", "island", "jungle", "kettle",
         "lemon", "mango", "night", "ocean", "pepper", "queen", "river", "stone", "tiger", "umbrella", "violet",
         "window", "yellow", "zebra", "level", "radar", "noon", "civic", "hello", "world", "python", "code", "data",
         "sky", "blue", "green", "red", "cat", "dog", "sun", "moon", "star", "tree", "book", "door")


@dataclass(frozen=True)
class Task:
    names: tuple[str, ...]  # function names to pick from
    params: str  # "numbers: List[int]" with {p} for the picked parameter name
    returns: str
    doc: str  # the task, with {p} for the parameter name
    body: str  # reference body, with {p}
    inputs: str  # how example inputs are drawn: a kind `_inputs` knows (ints, sentence, int, two_lists, ...)
    param_names: tuple[str, ...] = ("numbers",)


# Filters over integers, combined with folds below: (name part, text, condition on x with {k}, k choices)
FILTERS = (
    ("even", "even", "x % 2 == 0", (None,)),
    ("odd", "odd", "x % 2 != 0", (None,)),
    ("positive", "positive", "x > 0", (None,)),
    ("negative", "negative", "x < 0", (None,)),
    ("greater_than_{k}", "greater than {k}", "x > {k}", (3, 5, 10)),
    ("less_than_{k}", "less than {k}", "x < {k}", (0, 4, 7)),
    ("divisible_by_{k}", "divisible by {k}", "x % {k} == 0", (3, 4, 5, 7)),
    ("nonzero", "not zero", "x != 0", (None,)),
)
# Folds: (name templates, return type, doc template, body template); {f} name part, {t} text, {c} condition
FOLDS = (
    (("sum_{f}", "sum_of_{f}", "total_{f}"), "int", "Return the sum of the numbers in {p} that are {t}.",
     "return sum(x for x in {p} if {c})"),
    (("count_{f}", "how_many_{f}"), "int", "Return how many numbers in {p} are {t}.",
     "return sum(1 for x in {p} if {c})"),
    (("keep_{f}", "filter_{f}", "select_{f}"), "List[int]",
     "Return a list of the numbers in {p} that are {t}, in their original order.",
     "return [x for x in {p} if {c}]"),
    (("remove_{f}", "drop_{f}"), "List[int]", "Return {p} without the numbers that are {t}, keeping the order of the rest.",
     "return [x for x in {p} if not ({c})]"),
    (("largest_{f}", "max_{f}"), "Optional[int]",
     "Return the largest number in {p} that is {t}, or None if there is no such number.",
     "candidates = [x for x in {p} if {c}]\n    return max(candidates) if candidates else None"),
    (("smallest_{f}", "min_{f}"), "Optional[int]",
     "Return the smallest number in {p} that is {t}, or None if there is no such number.",
     "candidates = [x for x in {p} if {c}]\n    return min(candidates) if candidates else None"),
    (("any_{f}", "has_{f}", "contains_{f}"), "bool", "Return True if at least one number in {p} is {t}.",
     "return any({c} for x in {p})"),
    (("all_{f}", "only_{f}"), "bool", "Return True if every number in {p} is {t}. An empty list gives True.",
     "return all({c} for x in {p})"),
    (("first_{f}_index", "index_of_first_{f}"), "int",
     "Return the index of the first number in {p} that is {t}, or -1 if there is none.",
     "for i, x in enumerate({p}):\n        if {c}:\n            return i\n    return -1"),
    (("product_of_{f}", "multiply_{f}"), "int",
     "Return the product of the numbers in {p} that are {t}. The product of no numbers is 1.",
     "result = 1\n    for x in {p}:\n        if {c}:\n            result *= x\n    return result"),
)
LEFT_OUT = {"keep_positive", "filter_positive", "select_positive"}  # HumanEval's get_positive
LISTS = ("numbers", "nums", "values", "lst", "arr", "l")
TASKS = (
    Task(("square_all", "squares"), "{p}: List[int]", "List[int]", "Return a list with the square of every number in {p}.",
         "return [x * x for x in {p}]", "ints", LISTS),
    Task(("cumulative_sum", "running_total"), "{p}: List[int]", "List[int]",
         "Return the running sums of {p}: element i is the sum of the first i + 1 numbers.",
         "result = []\n    total = 0\n    for x in {p}:\n        total += x\n        result.append(total)\n    return result",
         "ints", LISTS),
    Task(("differences", "pairwise_differences"), "{p}: List[int]", "List[int]",
         "Return the differences between neighbouring numbers in {p}: element i is {p}[i + 1] - {p}[i].",
         "return [b - a for a, b in zip({p}, {p}[1:])]", "ints", LISTS),
    Task(("unique_in_order", "dedupe"), "{p}: List[int]", "List[int]",
         "Remove repeated numbers from {p}, keeping the first occurrence of each in the original order.",
         "seen = set()\n    result = []\n    for x in {p}:\n        if x not in seen:\n            seen.add(x)\n"
         "            result.append(x)\n    return result", "ints", LISTS),
    Task(("second_largest",), "{p}: List[int]", "Optional[int]",
         "Return the second largest distinct number in {p}, or None if there are fewer than two distinct numbers.",
         "distinct = sorted(set({p}))\n    return distinct[-2] if len(distinct) > 1 else None", "ints", LISTS),
    Task(("mean", "average"), "{p}: List[float]", "float",
         "Return the arithmetic mean of {p}. {p} is never empty.", "return sum({p}) / len({p})", "ints1", LISTS),
    Task(("value_range", "spread"), "{p}: List[int]", "int",
         "Return the difference between the largest and the smallest number in {p}. {p} is never empty.",
         "return max({p}) - min({p})", "ints1", LISTS),
    Task(("sort_by_absolute", "sort_abs"), "{p}: List[int]", "List[int]",
         "Return the numbers of {p} sorted by absolute value; equal absolute values keep their order.",
         "return sorted({p}, key=abs)", "ints", LISTS),
    Task(("rotate_left", "rotate"), "{p}: List[int], k: int", "List[int]",
         "Rotate {p} left by k places: the first k elements move to the end. k may exceed the length.",
         "if not {p}:\n        return []\n    k %= len({p})\n    return {p}[k:] + {p}[:k]", "ints_k", LISTS),
    Task(("chunk", "split_into_chunks"), "{p}: List[int], size: int", "List[List[int]]",
         "Split {p} into consecutive chunks of the given size; the last chunk may be shorter.",
         "return [{p}[i:i + size] for i in range(0, len({p}), size)]", "ints_size", LISTS),
    Task(("count_occurrences", "count_value"), "{p}: List[int], target: int", "int",
         "Return how many times target appears in {p}.", "return sum(1 for x in {p} if x == target)",
         "ints_target", LISTS),
    Task(("dot_product",), "a: List[int], b: List[int]", "int",
         "Return the dot product of two lists of the same length.", "return sum(x * y for x, y in zip(a, b))",
         "two_lists"),
    Task(("add_lists", "elementwise_sum"), "a: List[int], b: List[int]", "List[int]",
         "Return the element-wise sum of two lists of the same length.", "return [x + y for x, y in zip(a, b)]",
         "two_lists"),
    Task(("interleave",), "a: List[int], b: List[int]", "List[int]",
         "Interleave two lists of the same length: a[0], b[0], a[1], b[1], and so on.",
         "result = []\n    for x, y in zip(a, b):\n        result.extend([x, y])\n    return result", "two_lists"),
    Task(("flatten",), "{p}: List[List[int]]", "List[int]", "Flatten a list of lists into one list, in order.",
         "return [x for inner in {p} for x in inner]", "nested", ("lists", "nested", "rows")),
    Task(("row_sums",), "{p}: List[List[int]]", "List[int]", "Return the sum of every inner list of {p}.",
         "return [sum(row) for row in {p}]", "nested", ("rows", "matrix", "grid")),
    Task(("reverse_words", "words_backwards"), "{p}: str", "str",
         "Return {p} with the order of its words reversed. Words are separated by single spaces.",
         "return ' '.join({p}.split()[::-1])", "sentence", ("sentence", "text", "s")),
    Task(("capitalize_words", "title_words"), "{p}: str", "str",
         "Return {p} with the first letter of every word in upper case.",
         "return ' '.join(w[:1].upper() + w[1:] for w in {p}.split(' '))", "sentence", ("sentence", "text", "s")),
    Task(("word_lengths",), "{p}: str", "List[int]", "Return the length of every word in {p}, in order.",
         "return [len(w) for w in {p}.split()]", "sentence", ("sentence", "text", "s")),
    Task(("char_frequencies", "letter_counts"), "{p}: str", "Dict[str, int]",
         "Return a dictionary that maps every character of {p} to the number of times it occurs.",
         "counts = {{}}\n    for c in {p}:\n        counts[c] = counts.get(c, 0) + 1\n    return counts", "word",
         ("s", "word", "text")),
    Task(("first_repeated_char",), "{p}: str", "Optional[str]",
         "Return the first character of {p} that occurs a second time, or None if no character repeats.",
         "seen = set()\n    for c in {p}:\n        if c in seen:\n            return c\n        seen.add(c)\n    return None",
         "word", ("s", "word")),
    Task(("acronym",), "{p}: str", "str", "Return the upper-case first letters of the words in {p}.",
         "return ''.join(w[0].upper() for w in {p}.split())", "sentence", ("phrase", "text", "s")),
    Task(("digit_sum", "sum_of_digits"), "n: int", "int", "Return the sum of the decimal digits of the non-negative integer n.",
         "return sum(int(d) for d in str(n))", "int"),
    Task(("count_digits", "num_digits"), "n: int", "int", "Return how many decimal digits the non-negative integer n has.",
         "return len(str(n))", "int"),
    Task(("factorial",), "n: int", "int", "Return n! for a non-negative integer n.",
         "result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result", "tiny_int"),
    Task(("is_perfect_square",), "n: int", "bool", "Return True if the non-negative integer n is the square of an integer.",
         "root = int(n ** 0.5)\n    return root * root == n or (root + 1) * (root + 1) == n", "int"),
    Task(("reverse_number", "reverse_digits"), "n: int", "int", "Return the non-negative integer n with its digits reversed.",
         "return int(str(n)[::-1])", "int"),
    Task(("sum_of_divisors",), "n: int", "int", "Return the sum of the positive divisors of n that are smaller than n.",
         "return sum(d for d in range(1, n) if n % d == 0)", "small_int1"),
    Task(("is_power_of_two",), "n: int", "bool", "Return True if n is a power of two (1, 2, 4, 8, ...).",
         "return n > 0 and n & (n - 1) == 0", "int"),
    Task(("collatz_steps",), "n: int", "int",
         "Return how many steps the Collatz rule (n / 2 if n is even, else 3n + 1) takes to bring n to 1.",
         "steps = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n    return steps",
         "small_int1"),
    Task(("count_divisors",), "n: int", "int", "Return the number of positive divisors of n.",
         "return sum(1 for d in range(1, n + 1) if n % d == 0)", "small_int1"),
    Task(("index_of_max", "argmax"), "{p}: List[int]", "int",
         "Return the index of the largest number in {p}; if it occurs several times, the first index. {p} is never empty.",
         "return {p}.index(max({p}))", "ints1", LISTS),
    Task(("clamp_all", "clip_values"), "{p}: List[int], low: int, high: int", "List[int]",
         "Return {p} with every number below low replaced by low and every number above high replaced by high.",
         "return [min(max(x, low), high) for x in {p}]", "ints_bounds", LISTS),
    Task(("product_of_all", "list_product"), "{p}: List[int]", "int",
         "Return the product of all numbers in {p}. The product of an empty list is 1.",
         "result = 1\n    for x in {p}:\n        result *= x\n    return result", "ints", LISTS),
    Task(("count_runs", "number_of_runs"), "{p}: List[int]", "int",
         "Return the number of runs in {p}, a run being a maximal stretch of equal neighbouring numbers.",
         "return sum(1 for i, x in enumerate({p}) if i == 0 or {p}[i - 1] != x)", "ints_runs", LISTS),
    Task(("every_other", "even_positions"), "{p}: List[int]", "List[int]",
         "Return the elements of {p} at positions 0, 2, 4 and so on.", "return {p}[::2]", "ints", LISTS),
    Task(("mirror", "palindromize_list"), "{p}: List[int]", "List[int]",
         "Return {p} followed by its elements in reverse order.", "return {p} + {p}[::-1]", "ints", LISTS),
    Task(("zip_to_dict", "pair_up"), "keys: List[str], values: List[int]", "Dict[str, int]",
         "Return a dictionary that maps keys[i] to values[i]; both lists have the same length.",
         "return dict(zip(keys, values))", "keys_values"),
    Task(("count_words", "word_count"), "{p}: str", "int", "Return the number of words in {p}; words are separated by spaces.",
         "return len({p}.split())", "sentence", ("sentence", "text", "s")),
    Task(("double_letters", "stutter"), "{p}: str", "str", "Return {p} with every character written twice.",
         "return ''.join(c * 2 for c in {p})", "word", ("s", "word", "text")),
    Task(("last_word",), "{p}: str", "str", "Return the last word of {p}.", "return {p}.split()[-1]", "sentence",
         ("sentence", "text", "s")),
    Task(("spaces_to_underscores", "snake_spaces"), "{p}: str", "str", "Return {p} with every space replaced by an underscore.",
         "return {p}.replace(' ', '_')", "sentence", ("s", "text", "title")),
    Task(("digit_list", "digits_of"), "n: int", "List[int]", "Return the decimal digits of the non-negative integer n, most significant first.",
         "return [int(d) for d in str(n)]", "int"),
    Task(("sum_of_squares_up_to",), "n: int", "int", "Return 1 * 1 + 2 * 2 + ... + n * n.",
         "return sum(i * i for i in range(1, n + 1))", "small_int"),
)


def exercise_conversations(count: int = 1024, seed: int = 0):
    """Up to `count` distinct exercises as conversations (a prompt to complete, a reference answer)."""
    rng = random.Random(seed)
    groups = _task_groups()
    seen = set()
    attempts = 0
    while len(seen) < count and attempts < count * 20:
        attempts += 1
        name, signature, returns, doc, body, kind = rng.choice(rng.choice(groups))
        prompt, answer = _exercise(rng, name, signature, returns, doc, body, kind)
        if prompt in seen:
            continue
        seen.add(prompt)
        yield {"id": f"exercise-{len(seen) - 1}", "source": name,
               "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def _task_groups():
    """Per task (a fold, or an entry of TASKS), every (name, signature, return type, doc, body, input kind) it allows.

    Exercises pick a task first, then one of its variants, so that the many filter-fold variants
    do not crowd out the other tasks."""
    groups = []
    for names, returns, doc, body in FOLDS:
        groups.append([(name.format(f=part.format(k=k)), f"{p}: List[int]", returns,
                        doc.format(p=p, t=text.format(k=k)), body.format(p=p, c=condition.format(k=k)), "ints")
                       for part, text, condition, ks in FILTERS for k in ks for p in LISTS for name in names
                       if name.format(f=part) not in LEFT_OUT])
    for task in TASKS:
        groups.append([(name, task.params.format(p=p), task.returns, task.doc.format(p=p), task.body.format(p=p),
                        task.inputs) for p in task.param_names for name in task.names])
    return groups


def _exercise(rng: random.Random, name, signature, returns, doc, body, kind) -> tuple[str, str]:
    def_line = f"def {name}({signature}) -> {returns}:"
    source = f"{def_line}\n    {body}\n"
    scope: dict = {}
    exec(compile("from typing import Dict, List, Optional\n" + source, f"<exercise {name}>", "exec"), scope)
    function = scope[name]
    calls = []
    for _ in range(rng.choice((2, 2, 3, 3, 4))):
        args = _inputs(rng, kind)
        call = f"{name}({', '.join(repr(a) for a in args)})"
        if all(call != c for c, _ in calls):
            calls.append((call, repr(function(*args))))
    typing = sorted({t for t in ("Dict", "List", "Optional") if re.search(rf"\b{t}\[", f"{signature} {returns}")})
    header = f"from typing import {', '.join(typing)}\n\n\n" if typing else ""
    lines = textwrap.wrap(doc, 76)
    if rng.random() < 0.5:
        examples = [line for call, result in calls for line in (f">>> {call}", result)]
    else:
        examples = ["For example:"] + [f"{call} == {result}" for call, result in calls]
    opening = rng.choice(('"""', '""" '))
    docstring = "\n    ".join([opening + lines[0], *lines[1:], *examples, '"""'])
    stub = f"{header}{def_line}\n    {docstring}\n"
    answer = f"```python\n{stub}    {body}\n```"
    return stub, answer


def _inputs(rng: random.Random, kind: str) -> tuple:
    def ints(low=1, high=8, span=12):
        return [rng.randint(-span, span) for _ in range(rng.randint(low, high))]

    def sentence(low=2, high=6):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))

    if kind == "ints":
        return ([] if rng.random() < 0.1 else ints(),)
    if kind == "ints1":
        return (ints(),)
    if kind == "ints_k":
        return ints(0, 7), rng.randint(0, 9)
    if kind == "ints_bounds":
        low = rng.randint(-5, 2)
        return ints(0, 7), low, low + rng.randint(2, 8)
    if kind == "ints_runs":
        return ([rng.choice((1, 2, 3)) for _ in range(rng.randint(0, 8))],)
    if kind == "keys_values":
        keys = rng.sample(WORDS, rng.randint(1, 4))
        return keys, [rng.randint(0, 20) for _ in keys]
    if kind == "ints_size":
        return ints(0, 8), rng.randint(1, 4)
    if kind == "ints_target":
        values = ints(0, 8, 6)
        return values, rng.choice(values) if values and rng.random() < 0.6 else rng.randint(-6, 6)
    if kind == "two_lists":
        length = rng.randint(1, 5)
        return [rng.randint(-9, 9) for _ in range(length)], [rng.randint(-9, 9) for _ in range(length)]
    if kind == "nested":
        return ([ints(0, 3, 9) for _ in range(rng.randint(1, 4))],)
    if kind == "sentence":
        return (sentence(),)
    if kind == "word":
        return (rng.choice(WORDS),)
    if kind == "int":
        return (rng.choice((rng.randint(0, 20), rng.randint(0, 999), rng.randint(0, 99999))),)
    if kind == "small_int":
        return (rng.randint(0, 30),)
    if kind == "small_int1":
        return (rng.randint(1, 40),)
    if kind == "tiny_int":
        return (rng.randint(0, 10),)
    raise ValueError(f"unknown input kind {kind}")
