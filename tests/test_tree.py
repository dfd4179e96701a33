"""EAGLE-2 dynamic tree builder against a slow reference, and the slot bookkeeping."""

import math

import torch

from draftsmith.drafters.tree import TreeSlots, dynamic_tree

VOCAB = 12


def path_log_probs(path: tuple[int, ...]) -> torch.Tensor:
    """A fixed, made-up drafter: the next-token log-probs depend on the whole path."""
    seed = hash(path) % (2**31)
    return torch.log_softmax(torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2, -1)


class Recorder:
    """`grow` for the made-up drafter; remembers every node's path from the root."""

    def __init__(self):
        self.paths: dict[int, tuple[int, ...]] = {}
        self.calls: list[int] = []

    def grow(self, node_ids, tokens, parent_ids):
        self.calls.append(node_ids.numel())
        rows = []
        for node, token, parent in zip(node_ids.tolist(), tokens.tolist(), parent_ids.tolist()):
            assert parent == -1 or parent in self.paths, "a node is grown before its parent"
            self.paths[node] = (self.paths[parent] if parent >= 0 else ()) + (token,)
            rows.append(path_log_probs(self.paths[node]))
        return torch.stack(rows)


def reference_tree(depth, top_k, total_tokens):
    """EAGLE-2 written the slow way: (score, path) of the kept nodes."""
    candidates = []
    frontier = [(float(s), (int(t),)) for s, t in zip(*path_log_probs(()).topk(top_k))]
    candidates += frontier
    for _ in range(depth - 1):
        children = []
        for score, path in frontier:
            log_probs = path_log_probs(path)
            children += [(score + float(s), path + (int(t),)) for s, t in zip(*log_probs.topk(top_k))]
        candidates += children
        frontier = sorted(children, key=lambda c: -c[0])[:top_k]
    return sorted(candidates, key=lambda c: -c[0])[:total_tokens]


def paths_of(tokens, parents):
    paths = []
    for token, parent in zip(tokens.tolist(), parents.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths


def test_tree_matches_slow_reference():
    for depth, top_k, total in [(4, 3, 10), (5, 4, 30), (3, 2, 100), (1, 5, 3)]:
        recorder = Recorder()
        tokens, parents, scores = dynamic_tree(path_log_probs(()), recorder.grow, depth, top_k, total)
        expected = reference_tree(depth, top_k, total)
        assert tokens.numel() == min(total, top_k + (depth - 1) * top_k * top_k)
        assert recorder.calls == [top_k] * (depth - 1)
        assert (parents < torch.arange(tokens.numel())).all() and (parents >= -1).all()
        paths = paths_of(tokens, parents)
        assert sorted(paths) == sorted(p for _, p in expected)
        assert max(len(p) for p in paths) <= depth
        for path, score in zip(paths, scores.tolist()):
            true_score = sum(float(path_log_probs(path[:i])[path[i]]) for i in range(len(path)))
            assert math.isclose(score, true_score, abs_tol=1e-4)


def test_ties_keep_the_tree_connected():
    """With every log-prob equal to 0, every score ties; parents must still come with their children."""
    grow = lambda ids, tokens, parents: torch.zeros(ids.numel(), VOCAB)  # noqa: E731
    tokens, parents, _ = dynamic_tree(torch.zeros(VOCAB), grow, depth=4, top_k=3, total_tokens=7)
    assert tokens.numel() == 7
    assert (parents < torch.arange(7)).all()
    assert (parents[:3] == -1).all()  # the root's children were created first


def test_degenerate_shapes_give_empty_trees():
    for depth, top_k, total in [(0, 3, 5), (3, 0, 5), (3, 3, 0)]:
        tokens, parents, scores = dynamic_tree(path_log_probs(()), Recorder().grow, depth, top_k, total)
        assert tokens.numel() == parents.numel() == scores.numel() == 0


def test_tree_slots_track_ancestors_and_depth():
    slots = TreeSlots()
    parent_slots, depth, sees = slots.add(torch.tensor([0, 1]), torch.tensor([-1, -1]))
    assert parent_slots.tolist() == [-1, -1] and depth.tolist() == [1, 1]
    assert sees.tolist() == [[True, False], [False, True]]
    parent_slots, depth, sees = slots.add(torch.tensor([5, 7]), torch.tensor([1, 0]))
    assert parent_slots.tolist() == [1, 0] and depth.tolist() == [2, 2]
    assert sees.tolist() == [[False, True, True, False], [True, False, False, True]]
    _, depth, sees = slots.add(torch.tensor([9]), torch.tensor([5]))
    assert depth.tolist() == [3] and sees.tolist() == [[False, True, True, False, True]]
