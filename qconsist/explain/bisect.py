"""The smallest set of switches that makes an effect vanish: delta debugging (Zeller and Hildebrandt's
ddmin) over graph transformer names, with every answer remembered so no configuration is probed twice."""

from __future__ import annotations

from typing import Callable, Sequence


def _split(items: list[str], parts: int) -> list[list[str]]:
    size, rest = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < rest else 0)
        chunks.append(items[start:end])
        start = end
    return [c for c in chunks if c]


def minimal_set(candidates: Sequence[str], vanishes: Callable[[tuple[str, ...]], bool]) -> list[str]:
    """A 1-minimal subset of ``candidates`` whose disabling makes the effect vanish: ``vanishes(subset)`` is
    true for it and false for each subset with one name fewer.

    ``vanishes(candidates)`` must be true (the caller checks it first); ``vanishes(())`` is taken as false
    (the effect is there with nothing disabled). Answers are cached, so each subset costs one probe at most.
    """
    memo: dict[tuple[str, ...], bool] = {(): False, tuple(sorted(candidates)): True}

    def test(subset: Sequence[str]) -> bool:
        key = tuple(sorted(subset))
        if key not in memo:
            memo[key] = vanishes(key)
        return memo[key]

    current = list(candidates)
    parts = 2
    while len(current) >= 2:
        chunks = _split(current, parts)
        found = next((c for c in chunks if test(c)), None)
        if found is not None:
            current, parts = found, 2
            continue
        if parts > 2:
            complement = next((rest for c in chunks if test(rest := [n for n in current if n not in c])), None)
            if complement is not None:
                current, parts = complement, max(parts - 1, 2)
                continue
        if parts >= len(current):
            break
        parts = min(2 * parts, len(current))
    return current
