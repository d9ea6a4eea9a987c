"""The tasks' draws are fixed: the split logic shared by arithmetic, countdown_trace and gym
(``satrl.tasks.splits``) must give exactly the problems each task drew before it was written once.

Each case hashes the id, prompt and answer of the first problems of both splits for a few seeds. The digests were
computed by this file's ``_digest`` on the tree just before the split logic moved to ``satrl.tasks.splits``; a
change to any draw (another rng call, another order, another id) changes a digest and fails here.
"""

import hashlib
from itertools import islice

import pytest

from satrl.tasks import make_task

N_TRAIN = 40  # train problems hashed per seed

CASES = {
    # name: (task name, task.kwargs); each space and branch of the draws: small (enumerated) and large (rejection
    # sampled) arithmetic, eval seeds fixed and from the call, excluded draws, chained exclusions, a sized stream
    "arith-3+": ("arithmetic", {"n_eval": 30}),
    "arith-2+-*": ("arithmetic", {"digits": 2, "ops": "+-*", "n_eval": 25, "eval_seed": None}),
    "arith-4-large": ("arithmetic", {"digits": 4, "ops": "+*", "n_eval": 20, "eval_seed": None}),
    "arith-excl": ("arithmetic", {"digits": 2, "n_eval": 20, "eval_seed": None, "exclude_eval_seeds": (0, 6),
                                  "exclude_n_eval": 300}),  # fmt: skip
    "arith-4-excl": ("arithmetic", {"digits": 4, "n_eval": 20, "eval_seed": None, "exclude_eval_seeds": (0, 6)}),
    "arith-sized": ("arithmetic", {"n_train": 5, "n_eval": 10}),
    "countdown": ("countdown_trace", {"n_eval": 12}),
    "countdown-excl": ("countdown_trace", {"n_eval": 10, "eval_seed": None, "exclude_eval_seeds": (0, 6),
                                           "exclude_n_eval": 400}),  # fmt: skip
    "countdown-chain": ("countdown_trace", {"n_eval": 10, "eval_seed": None, "exclude_eval_seeds": (0, 6),
                                            "exclude_n_eval": 400, "chain_exclusions": True}),  # fmt: skip
    "gym-countdown": ("gym:countdown", {"size": 12, "n_eval": 4}),
    "gym-basic": ("gym:basic_arithmetic", {"size": 20, "n_eval": 6, "eval_seed": None, "min_terms": 2,
                                           "max_terms": 2}),  # fmt: skip
}
SEEDS = (0, 1, 6)

DIGESTS = {  # _digest of each case on the tree before satrl.tasks.splits (commit 600a0f79)
    "arith-2+-*": "3f97e71401e77ea7",
    "arith-3+": "ddde54caa474a540",
    "arith-4-excl": "59c973c9404f46de",
    "arith-4-large": "e4fc47d421e71c15",
    "arith-excl": "d663bcf74d682976",
    "arith-sized": "47cce1e78e1ecf4b",
    "countdown": "68963f0ca6517989",
    "countdown-chain": "d3fc21e5db389c90",
    "countdown-excl": "c25c0af2f8e3ec88",
    "gym-basic": "5269e494a508f896",
    "gym-countdown": "3c2baf3271ef7209",
}


def _digest(name: str, kwargs: dict) -> str:
    h = hashlib.sha256()
    task = make_task(name, **kwargs)  # one task for every seed and split: its caches are part of what is tested
    for seed in SEEDS:
        for split in ("eval", "train"):
            for p in islice(task.problems(split, seed), N_TRAIN):
                h.update(f"{seed}|{split}|{p.id}|{p.prompt}|{p.answer}\n".encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_draws_are_the_ones_drawn_before_the_split_logic_was_shared(case):
    name, kwargs = CASES[case]
    if name.startswith("gym:"):
        pytest.importorskip("reasoning_gym")
    assert _digest(name, kwargs) == DIGESTS[case]


def test_every_case_draws_its_own_problems():
    # two equal digests would mean a case tests nothing its twin does not (an exclusion that never bites)
    assert len(set(DIGESTS.values())) == len(DIGESTS) and set(DIGESTS) == set(CASES)
