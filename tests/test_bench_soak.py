"""benchmarks/soak.py keeps working against the pipeline it spies on (it broke once when the snapshot store's method
was renamed, and nothing noticed): a short soak runs, samples both processes' memory and checks the store."""

from benchmarks.soak import soak


def test_a_short_soak_runs_and_checks_the_store():
    r = soak(8)  # two windows of the broadcast schedule (lag.n=4): the store is updated and checked across both
    assert r["steps"] == 8 and r["store_max"] >= 1 and r["store_unneeded"] == 0
    assert r["trainer_rss_mb"][1] > 0 and r["engine_rss_mb"][1] > 0
