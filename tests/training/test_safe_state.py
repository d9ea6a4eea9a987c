"""The checkpoint state codec: a checkpoint written before a dataclass lost a field still loads."""

import torch

from satrl.training.safe_state import decode, encode
from satrl.types import Sample


def test_sample_round_trips_and_old_fields_are_dropped():
    s = Sample("b000000-g0000-i000", "b000000-g0000", [1, 2], [3], torch.tensor([-0.5]), 4, 1.0, meta={"x": True})
    tree, tensors = encode({"ready": [s]})
    back = decode(tree, tensors, {"Sample": Sample})["ready"][0]
    assert back.id == s.id and back.prompt_ids == [1, 2] and torch.equal(back.behavior_logp, s.behavior_logp)
    assert back.meta == {"x": True}
    old = tree["ready"][0]  # as written before Sample lost its unread problem_id and finish_reason fields
    old["fields"].update(problem_id="p7", finish_reason="length")
    again = decode(tree, tensors, {"Sample": Sample})["ready"][0]
    assert again.id == s.id and not hasattr(again, "problem_id") and not hasattr(again, "finish_reason")
