"""The candidate index: the leasable proxies a selector matches, best first (issue 12).

The lease store keeps every leasable candidate here, in the bucket of all
candidates and in one bucket per attribute pair it has (`region=eu`). Inside a
bucket a candidate sits in exactly one of three ordered lists:

* `free`: it can take a lease; ordered by (active leases, latency with unknown
  last, key), the order the API promises (docs/reference.md), so the best is the first entry;
* `full`: active leases ≥ maxLeases; ordered by when its soonest lease ends;
* `cooled`: in a global cooldown; ordered by when that cooldown ends.

Every grant, release, expiry, global cooldown start or end and cache change
moves one candidate between the lists of its own buckets: O(b log n) with
b = 1 + its attribute count (at most 33). Nothing here scans the fleet.

`choose` walks the free list of the selector's smallest bucket (terms
intersected smallest first) and takes the first entry that matches the other
terms and has no cooldown for the asked target. Per-target cooldowns are not
placed (a proxy banned by one site is free for every other), so the walk visits
at most 1 + (the free matching candidates cooled for this target) + (the free
entries of the smallest term's bucket that miss another term). The first part
is bounded by the cooldowns in force for one site; the second is 0 for the
empty and one-term selectors clients use, and for several terms it is bounded
by the smallest term's bucket. A refusal adds the cooldowns of that target (to
count the full ones among them) and, for several terms only, the smallest
term's full and cooled lists; with no selector or one term its counts and its
soonest end are read off the lists' lengths and heads.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping
from typing import Any

import attrs
from sortedcontainers import SortedList

from egressd.leases.interface import Candidate

Term = tuple[str, str]
Rank = tuple[Any, ...]


class _Place(enum.Enum):
    FREE = "free"
    FULL = "full"
    COOLED = "cooled"


@attrs.frozen
class Load:
    """What the store knows of one candidate: leases, a global cooldown, the soonest end."""

    active: int = 0
    cooled_until: float | None = None
    soonest_end: float = math.inf


@attrs.frozen
class Blocked:
    """No matching candidate is free: each leasable match counted in one bucket.

    `ready_at` is the soonest moment a lease or cooldown of a match ends
    (wall seconds), None when nothing will end (maxLeases 0, no match).
    """

    in_cooldown: int
    at_capacity: int
    ready_at: float | None


class _Bucket:
    __slots__ = ("cooled", "free", "full")

    def __init__(self) -> None:
        # free: (active, latency unknown, latency, key); full: (soonest end, key);
        # cooled: (global cooldown end, key). The key last makes every rank unique.
        self.free: SortedList[Rank] = SortedList()
        self.full: SortedList[Rank] = SortedList()
        self.cooled: SortedList[Rank] = SortedList()

    def __len__(self) -> int:
        return len(self.free) + len(self.full) + len(self.cooled)

    def at(self, place: _Place) -> SortedList[Rank]:
        return getattr(self, place.value)  # type: ignore[no-any-return]


@attrs.define
class _Entry:
    candidate: Candidate
    load: Load
    place: _Place
    rank: Rank
    buckets: list[_Bucket]


def _has(attributes: Mapping[str, str], terms: Mapping[str, str]) -> bool:
    return all(attributes.get(k) == v for k, v in terms.items())


def _placement(candidate: Candidate, load: Load) -> tuple[_Place, Rank]:
    key = candidate.key
    if load.cooled_until is not None:
        return _Place.COOLED, (load.cooled_until, key)
    if load.active >= candidate.max_leases:
        return _Place.FULL, (load.soonest_end, key)
    latency = candidate.latency_ms
    return _Place.FREE, (load.active, latency is None, 0.0 if latency is None else latency, key)


class CandidateIndex:
    """Leasable candidates by selector term, each bucket ordered for selection."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._all = _Bucket()
        self._terms: dict[Term, _Bucket] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    # --- changes ----------------------------------------------------------------------------

    def put(self, candidate: Candidate, load: Load) -> None:
        """Add a candidate, or replace it (its attributes, capacity or latency changed)."""
        old = self._entries.get(candidate.key)
        if old is not None:
            if old.candidate == candidate:
                self.update(candidate.key, load)
                return
            self.remove(candidate.key)
        buckets = [self._all]
        for term in candidate.attributes.items():
            bucket = self._terms.get(term)
            if bucket is None:
                bucket = self._terms[term] = _Bucket()
            buckets.append(bucket)
        place, rank = _placement(candidate, load)
        self._entries[candidate.key] = _Entry(candidate, load, place, rank, buckets)
        for bucket in buckets:
            bucket.at(place).add(rank)

    def update(self, key: str, load: Load) -> None:
        """Move a candidate after its load changed; a key not in the index is ignored."""
        entry = self._entries.get(key)
        if entry is None:
            return
        place, rank = _placement(entry.candidate, load)
        entry.load = load
        if (place, rank) == (entry.place, entry.rank):
            return
        for bucket in entry.buckets:
            bucket.at(entry.place).remove(entry.rank)
            bucket.at(place).add(rank)
        entry.place, entry.rank = place, rank

    def remove(self, key: str) -> None:
        """Forget a candidate (it left the cache or is no longer leasable)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        for bucket in entry.buckets:
            bucket.at(entry.place).remove(entry.rank)
        for term in entry.candidate.attributes.items():
            if not self._terms[term]:
                del self._terms[term]  # no bucket outlives the last proxy with its label

    # --- selection --------------------------------------------------------------------------

    def choose(self, selector: Mapping[str, str], *, cooling: Mapping[str, float],
               exclude: Collection[str] = (), only: str | None = None) -> str | Blocked:
        """The best free candidate matching `selector` and not in `cooling` (key → until).

        `exclude` (a few keys: the gateway's proxies already tried) are passed over
        and counted nowhere; `only` asks for that one candidate or none.
        """
        if only is not None:
            return self._choose_only(only, selector, cooling=cooling, exclude=exclude)
        bucket, rest = self._bucket(selector)
        if bucket is None:
            return Blocked(in_cooldown=0, at_capacity=0, ready_at=None)
        entries = self._entries
        skipped = 0
        ready = math.inf
        for rank in bucket.free:
            key: str = rank[3]
            if key in exclude or (rest and not _has(entries[key].candidate.attributes, rest)):
                continue
            until = cooling.get(key)
            if until is None:
                return key
            skipped += 1
            ready = min(ready, until)
        counts = self._blocked(bucket, selector, rest, cooling, exclude)
        return Blocked(in_cooldown=skipped + counts.in_cooldown, at_capacity=counts.at_capacity,
                       ready_at=_when(_sooner(ready, counts.ready_at)))

    def _choose_only(self, key: str, selector: Mapping[str, str], *,
                     cooling: Mapping[str, float], exclude: Collection[str]) -> str | Blocked:
        entry = self._entries.get(key)
        if entry is None or key in exclude or not _has(entry.candidate.attributes, selector):
            return Blocked(in_cooldown=0, at_capacity=0, ready_at=None)
        until = cooling.get(key)
        if entry.place is _Place.FREE and until is None:
            return key
        if entry.place is _Place.COOLED:
            return Blocked(in_cooldown=1, at_capacity=0, ready_at=entry.load.cooled_until)
        ready = _sooner(math.inf if until is None else until,
                        entry.load.soonest_end if entry.place is _Place.FULL else None)
        return Blocked(in_cooldown=int(until is not None),
                       at_capacity=int(until is None), ready_at=_when(ready))

    def _bucket(self, selector: Mapping[str, str]) -> tuple[_Bucket | None, dict[str, str]]:
        """The smallest bucket of the selector's terms and the terms left to check."""
        if not selector:
            return self._all, {}
        sized: list[tuple[int, Term, _Bucket]] = []
        for term in selector.items():
            bucket = self._terms.get(term)
            if bucket is None:
                return None, {}
            sized.append((len(bucket), term, bucket))
        _, first, smallest = min(sized, key=lambda s: (s[0], s[1]))
        return smallest, {k: v for k, v in selector.items() if (k, v) != first}

    def _blocked(self, bucket: _Bucket, selector: Mapping[str, str], rest: Mapping[str, str],
                 cooling: Mapping[str, float], exclude: Collection[str]) -> Blocked:
        """The full and globally cooled matches: counts and their soonest end."""
        if rest:
            # Several terms: only the smallest term's lists can be walked (module doc).
            cooled, ready = self._walk(bucket.cooled, rest, exclude)
            full, soonest = self._walk(bucket.full, rest, exclude)
            ready = _sooner(ready, soonest)
        else:
            # Every entry of the bucket matches: lengths and heads, less the few excluded
            # (the gateway's tried proxies), never a walk of the fleet.
            cooled, ready = self._less(bucket.cooled, _Place.COOLED, selector, exclude)
            full, soonest = self._less(bucket.full, _Place.FULL, selector, exclude)
            ready = _sooner(ready, soonest)
        # A full candidate with a cooldown for this target counts as cooling (refusal counts).
        full_cooling = 0
        for key, until in cooling.items():
            entry = self._entries.get(key)
            if (entry is not None and entry.place is _Place.FULL and key not in exclude
                    and _has(entry.candidate.attributes, selector)):
                full_cooling += 1
                ready = _sooner(ready, until)
        return Blocked(in_cooldown=cooled + full_cooling, at_capacity=full - full_cooling,
                       ready_at=_when(ready))

    def _less(self, ranks: SortedList[Rank], place: _Place, selector: Mapping[str, str],
              exclude: Collection[str]) -> tuple[int, float]:
        """Length and first end of `ranks` (a bucket all matching) without `exclude`."""
        count = len(ranks) - sum(
            1 for key in exclude if (entry := self._entries.get(key)) is not None
            and entry.place is place and _has(entry.candidate.attributes, selector))
        # The head not excluded: at most len(exclude) + 1 steps.
        first = next((end for end, key in ranks if key not in exclude), math.inf)
        return count, first

    def _walk(self, ranks: SortedList[Rank], rest: Mapping[str, str],
              exclude: Collection[str]) -> tuple[int, float]:
        """How many of `ranks` match `rest` and are not excluded; the first one's end."""
        count, first = 0, math.inf
        for end, key in ranks:
            if key not in exclude and _has(self._entries[key].candidate.attributes, rest):
                count += 1
                first = min(first, end)
        return count, first


def _sooner(a: float, b: float | None) -> float:
    return a if b is None else min(a, b)


def _when(moment: float) -> float | None:
    """A wall time, or None for "never" (infinity: nothing will end)."""
    return None if math.isinf(moment) else moment
