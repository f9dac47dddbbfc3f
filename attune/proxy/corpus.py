"""The proxy's text: a synthetic corpus generated from a small grammar, char-level tokens.

Generated, not downloaded (no network on the machines this runs on), and deterministic: the
same documents in the same order on every machine, so a curve is reproducible from its seed.
The grammar has real structure (agreement, fixed phrases, word order) so a tiny model's loss
falls steadily for a few hundred steps instead of plateauing at the unigram entropy.

Documents vary in length and are padded, so micro-batches hold different numbers of valid
tokens: that is what makes loss-normalisation faults (per-micro-batch or per-rank means)
visible, as in the gate study.
"""

from __future__ import annotations

import functools
import hashlib
import random

import torch

PAD, BOS = 0, 1
_ALPHABET = "abcdefghijklmnopqrstuvwxyz .,;\n"
VOCAB_SIZE = 2 + len(_ALPHABET)
_CHAR_ID = {c: i + 2 for i, c in enumerate(_ALPHABET)}

_SUBJECTS = [("the fox", "s"), ("a small bird", "s"), ("the old man", "s"), ("my sister", "s"),
             ("the engineers", "p"), ("two cats", "p"), ("the children", "p"), ("our team", "s"),
             ("the river", "s"), ("these machines", "p"), ("a tired horse", "s"), ("the farmers", "p")]
_VERBS = [("see", "sees"), ("follow", "follows"), ("carry", "carries"), ("build", "builds"),
          ("watch", "watches"), ("find", "finds"), ("paint", "paints"), ("push", "pushes")]
_OBJECTS = ["the red box", "a long road", "the quiet town", "some bread", "the bright moon",
            "an empty boat", "the wooden bridge", "a green field", "the last train", "a cold stone"]
_PLACES = ["near the river", "at dawn", "in the rain", "before noon", "under the bridge",
           "after the storm", "by the old mill", "every morning"]
_JOINERS = ["and then", "but later", "so", "while"]


def _sentence(rng: random.Random) -> str:
    subject, number = rng.choice(_SUBJECTS)
    base, third = rng.choice(_VERBS)
    verb = third if number == "s" else base
    words = [subject, verb, rng.choice(_OBJECTS)]
    if rng.random() < 0.5:
        words.append(rng.choice(_PLACES))
    if rng.random() < 0.3:
        subject2, number2 = rng.choice(_SUBJECTS)
        base2, third2 = rng.choice(_VERBS)
        words += [rng.choice(_JOINERS), subject2, third2 if number2 == "s" else base2, rng.choice(_OBJECTS)]
    return " ".join(words)


def _document(rng: random.Random) -> str:
    n = rng.choice((1, 1, 1, 2, 2, 3))
    return ". ".join(_sentence(rng) for _ in range(n)) + ".\n"


TRAIN_DOCS = 32 * 400   # the train split's fixed size: shards (and data order) never depend on run length
_SEEDS = {"train": 20240601, "eval": 777001, "probe": 314159}


@functools.cache
def _train_set() -> frozenset[str]:
    return frozenset(documents("train", TRAIN_DOCS))


@functools.cache
def documents(split: str, count: int) -> tuple[str, ...]:
    """`count` documents of a split ("train", "eval" or "probe"). Eval and probe documents never
    occur in the train split (a small grammar repeats short sentences, so they are filtered)."""
    rng = random.Random(_SEEDS[split])
    if split == "train":
        return tuple(_document(rng) for _ in range(count))
    seen, out = _train_set(), []
    while len(out) < count:
        doc = _document(rng)
        if doc not in seen:
            out.append(doc)
    return tuple(out)


def encode(text: str, length: int) -> list[int]:
    """BOS + characters, truncated or PAD-padded to `length` ids."""
    ids = [BOS] + [_CHAR_ID[c] for c in text]
    return (ids + [PAD] * length)[:length]


def batch_tensor(docs: list[str] | tuple[str, ...], seq_len: int) -> torch.Tensor:
    """[n, seq_len + 1] token ids: inputs are [:, :-1], next-token targets [:, 1:]."""
    return torch.tensor([encode(d, seq_len + 1) for d in docs], dtype=torch.long)


def rank_shard(n_docs: int, dp: int, rank: int) -> range:
    """The contiguous slice of the train documents data-parallel rank `rank` of `dp` reads.

    Contiguous (not strided) on purpose: torchtitan's loader splits the dataset by DP rank, so a
    new DP degree gives different global batches. (A strided split would make every DP degree
    read the same batches and hide the data-order effect the gate has to tolerate.)
    """
    per = n_docs // dp
    return range(rank * per, (rank + 1) * per)


def batch_hash(samples: torch.Tensor) -> str:
    """Order-independent hash of the samples in one global batch (data identity, not layout)."""
    digests = sorted(hashlib.sha1(row.numpy().tobytes()).hexdigest() for row in samples)
    return hashlib.sha1("".join(digests).encode()).hexdigest()[:12]
