"""docs/troubleshooting.md names every reason the operator writes on a condition, an event or a
trial (read from the code by tests/docs/reasons.py), so a new reason without its entry fails."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.pages import DOCS
from tests.docs.reasons import built_reasons, literal_reasons

PAGE = DOCS / "troubleshooting.md"


def documented() -> set[str]:
    return set(re.findall(r"`([A-Z][A-Za-z0-9]+)`", PAGE.read_text()))


def test_every_reason_in_the_code_is_on_the_page() -> None:
    literal = literal_reasons()
    assert len(literal) > 40  # the scan finds the operator's reasons at all
    missing = {r: sorted(where) for r, where in literal.items() if r not in documented()}
    assert missing == {}, "add these reasons to docs/troubleshooting.md"


def test_every_built_reason_is_on_the_page() -> None:
    built = built_reasons()
    assert {"TrialInfeasible", "RetuneApplied", "EngineOOM", "PredictedEngineOOM"} <= built
    assert sorted(built - documented()) == []


def test_the_scan_sees_a_new_reason(tmp_path: Path) -> None:
    """Each form the operator writes a reason in is found by the scan."""
    module = tmp_path / "module.py"
    module.write_text('REASON = "NewConstant"\n'
                      'emit("Warning", "NewEvent", "m")\n'
                      'w.condition("X", False, "NewCondition", "m")\n'
                      'TrialResult(state, reason="NewTrialReason")\n'
                      'TrialEvent(kind, reason=REASON)\n'
                      'Refusal(field, "NewRefusal", "m")\n'
                      'conds = {"Running": (False, "NewTuple", "m")}\n'
                      'cause = "NewCause" if x else "OtherCause"\n'
                      'trial.set_user_attr(st.ATTR_REASON, "NewAttr")\n'
                      'emit("Warning", "not a reason", "m")\n')
    assert set(literal_reasons([module])) == {
        "NewEvent", "NewCondition", "NewTrialReason", "NewConstant", "NewRefusal", "NewTuple",
        "NewCause", "OtherCause", "NewAttr"}
