"""The built-in models' corpora cannot change under their cache keys unnoticed.

A cached built-in model is found by ``pretrain.cache_key``, a hash of its recipe's config,
not of the documents the corpus code writes from it: a change to a task's documents (a new
mistake, other filler, a changed template) under an unchanged recipe would leave every user
on a model pre-trained on the old documents. The keys are kept stable on purpose (a moved
key pre-trains again, minutes), so a task whose documents change says so with its
``corpus_version`` (``tempering.tasks.code.CodeTask`` did). This test holds a fingerprint of
each recipe's documents beside its key and fails when they part.

Reasoning-gym's documents are left out: they are the installed reasoning-gym's, not this
project's code, and a new release within the pinned range would fail the test for no change
here.
"""

import hashlib

import pytest

from tempering import generalist, tiny_long
from tempering.config import PretrainConfig
from tempering.pretrain import cache_key
from tempering.tasks import build_task

RECIPES = {"builtin:tiny": PretrainConfig, "builtin:tiny-long": tiny_long.recipe,
           "builtin:generalist": generalist.recipe}

FINGERPRINTS = {
    "3e8c2d172d9b4fd7": "279921edeb1539e9",
    "848a765ddb45bb01": "5f593b376e1a9fd9",
    "0268d1d5f8b3de53": "b9beda2cb2f0dcf0",
}
"""Cache key -> fingerprint of the documents its recipe's corpus code writes (:func:`fingerprint`)."""


def fingerprint(config: PretrainConfig) -> str:
    """A hash of each of the config's tasks' first 24 documents and the first of each stage of
    a length curriculum (``corpus_docs``), reasoning-gym tasks left out."""
    digest = hashlib.sha256()
    for spec in config.tasks:
        if spec.name.startswith("rg:"):
            continue
        task = build_task(spec.name, seed=config.seed, **spec.options)
        stages = spec.options.get("corpus_docs") or []
        indices = sorted({*range(24), *(sum(stages[:k]) for k in range(1, len(stages)))})
        for index in indices:
            digest.update(task.corpus_document(index, config.wrong_share, config.tool_share).encode())
    return digest.hexdigest()[:16]


@pytest.mark.parametrize("name", list(RECIPES))
def test_a_built_in_models_documents_are_those_its_cache_key_was_recorded_with(name):
    config = RECIPES[name]()
    key = cache_key(config)
    assert key in FINGERPRINTS, (
        f"{name}'s recipe has a new cache key {key}: record its documents' fingerprint {fingerprint(config)} "
        "in FINGERPRINTS (and drop the old key's entry)")
    assert fingerprint(config) == FINGERPRINTS[key], (
        f"{name}'s corpus writes other documents under the same cache key {key}: cached models were pre-trained "
        "on the old ones. Raise the changed task's corpus_version (or pretrain.CORPUS_VERSION) so the key moves, "
        "then record the new key's fingerprint")


def test_the_fingerprint_sees_a_changed_document(monkeypatch):
    from tempering.tasks.arithmetic import ArithmeticTask

    config = PretrainConfig()
    before = fingerprint(config)
    original = ArithmeticTask.corpus_document
    monkeypatch.setattr(ArithmeticTask, "corpus_document",
                        lambda self, *args, **kwargs: original(self, *args, **kwargs).replace("answer", "Answer"))
    assert fingerprint(config) != before and cache_key(config) == "3e8c2d172d9b4fd7"
