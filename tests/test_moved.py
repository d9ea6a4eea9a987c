"""Old public import paths still work after a move (issue 61: public paths kept), each warning once per process
with a DeprecationWarning that names the new path, and handing out the very same objects (not copies)."""

import json
import os
import subprocess
import sys

# Imported in a fresh process: the warning fires at a module's first import, which this test process may have
# done already.
PROBE = r"""
import json, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as first:
    from satrl.pipeline.buffer import SnapshotStore as old_store
    from satrl.weights.dist import receive as old_receive, send as old_send
with warnings.catch_warnings(record=True) as again:
    from satrl.pipeline.buffer import SnapshotStore
from satrl.weights.snapshot import SnapshotStore as store
from satrl.weights.link import receive, send
print(json.dumps({
    "first": [str(w.message) for w in first if issubclass(w.category, DeprecationWarning)],
    "again": [str(w.message) for w in again if issubclass(w.category, DeprecationWarning)],
    "same": [old_store is store, old_send is send, old_receive is receive],
}))
"""


def _probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=os.environ.copy(),
                          timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.splitlines()[-1])


def test_old_paths_warn_once_and_hand_out_the_same_objects():
    got = _probe()
    assert got["same"] == [True] * 3
    assert sorted(got["first"]) == sorted([
        "satrl.pipeline.buffer.SnapshotStore moved to satrl.weights.snapshot.SnapshotStore; the old path will be removed",
        "satrl.weights.dist moved to satrl.weights.link; the old path will be removed",
    ])  # fmt: skip
    assert got["again"] == []  # once per process


def test_a_missing_name_of_the_old_module_is_still_an_attribute_error():
    import pytest

    from satrl.pipeline import buffer

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        buffer.Nope  # noqa: B018
