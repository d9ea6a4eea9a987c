"""Issue 60: ``satrl report --interaction`` with the same lag (or cell) on both sides is refused in one line, exit 2,
before any folder is read (before the fix it reported an interaction of 0 by construction)."""

import pytest

from satrl.cli import main
from satrl.experiments.interaction import parse_interaction


@pytest.mark.parametrize("value, words", [("opob,grpo,8,8", "lag 8 on both sides"),
                                          ("grpo,grpo,32,0", "cell grpo on both sides")])  # fmt: skip
def test_degenerate_interaction_refused(tmp_path, capsys, value, words):
    with pytest.raises(ValueError, match=words):
        parse_interaction(value)
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path), "--interaction", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and words in err[-1] and "Traceback" not in "".join(err)


def test_two_lags_still_accepted():
    assert parse_interaction("opob,grpo,32,0").lag == 32
