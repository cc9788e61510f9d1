"""Paper A's design-rule controls beyond its findings (extensions of drift): final-norm
only, which the paper trains but reports no result for; the inter-loop norm, which its
design rule names and it never trains; and Parcae's stable injection. Each is judged
as the drift row judges the baseline, from the other side.
"""

from __future__ import annotations

import numpy as np

from loopscope.judge.group_a import GroupA, sweep_depth
from loopscope.judge.verdicts import Claim, at_least, at_most, below, claim, extension, not_shown


def _no_drift(g: GroupA, cell: str | None, text: str, what: str, key: str, source: str,
              why: str) -> Claim:
    """A design-rule control that should not drift (final-norm only, the inter-loop
    norm), judged as the drift row judges the baseline, from the other side: direction,
    the per-loop normed cell's final-loop norm above this cell's; magnitude, this cell's
    no larger than the largest of the paper's scale-controlled cells'. An extension of
    drift: the paper states no result for either (why, on the row); not shown without
    the cell (None) or the normed one."""
    if not (g.normed and cell):
        return extension(not_shown(text, why, "-", f"a per-loop normed or {what} cell is "
                                   "absent"), "drift")
    ours = g.mean(cell, "norm")
    ratio = g.mean(g.normed, "norm") / ours
    value = (f"final-loop mean norm {ours[0]:,.1f} ({cell}); normed / it "
             f"{g.docs.interval(ratio)}; growth {g.growth_text([cell])}")
    mags = []
    if g.controls:
        against = ours / np.max(np.stack([g.mean(c, "norm") for c in g.controls]), axis=0)
        value += f"; it / the largest control's {g.docs.interval(against)}"
        mags = [g.test("its norm / the largest control's", against, at_most, 1.0,
                       unit="ratio")]
    return extension(claim(
        text, why, f"final-loop mean norm of the per-loop normed cell / the {what} cell's > 1 "
        f"(interval); magnitude: the {what} cell's / the largest of the paper's "
        "scale-controlled cells' <= 1", value,
        [g.test(f"normed / {what} norm", ratio, at_least, 1.0, unit="ratio")], mags,
        key=key, source=source), "drift")


def final_norm(g: GroupA) -> Claim:
    """Paper A's third control, judged by the design rule: a final-norm-only cell reads
    raw before its last loop, so its intermediate losses see the scale and it should not
    drift (_no_drift)."""
    text = ("Final-norm only (raw readouts before the last loop) does not drift: its "
            "intermediate losses see the scale")
    fn = next((c for c, v in g.cells.items()
               if v.group == "final-norm only" and v.loss == "per_loop"), None)
    why = ("a trained control whose result the paper does not state (no number, no "
           "sentence); its design rule implies no drift, so this row is an extension of "
           "drift")
    return _no_drift(g, fn, text, "final-norm-only", "final_norm",
                     "paper A, controls: 'final norm only: raw readouts at intermediate "
                     "loops, a normalized one at the last'", why)


def interloop_norm(g: GroupA) -> Claim:
    """Paper A's design rule, its third option: normalization between loops removes the
    scale from the recurrent path, so a per-loop normed cell with it should not drift
    (_no_drift). Not one of the paper's seven trained conditions: the rule names it."""
    text = ("Normalization between loops (the design rule's third option) stops the drift: "
            "the scale is removed from the recurrent path")
    cell = next((c for c, v in g.cells.items() if v.loss == "per_loop"
                 and v.readout == "normed" and "inter-loop norm" in v.control), None)
    why = "named by the paper's design rule, never trained by it: an extension of drift"
    return _no_drift(g, cell, text, "inter-loop-norm", "interloop_norm",
                     "paper A, design rule: control recurrent scale 'by removing it from the "
                     "recurrent path (inter-loop norm)'", why)


def stable_injection(g: GroupA) -> Claim:
    """Beyond the paper (an extension): Parcae's claim for its stable injection is that
    the contraction bounds the state's growth across loops (every entry of A_bar in
    (0, 1)), not that the state's level matches a raw-readout cell's. So the row judges
    growth: the per-loop normed cell with stable injection against the same cell without
    it (the normed baseline), its scale's growth over the K trained loops (s_K / s_1)
    and over the depth sweep (s_L / s_1) below the baseline's; magnitude: its growth
    over the sweep no larger than the largest growth among the paper's controls. The
    level (final-loop norm) stands beside."""
    text = ("Stable injection bounds the state's growth across loops: a per-loop normed cell "
            "whose carried state is contracted every loop grows less than the baseline")
    found = next((c for c, v in g.cells.items()
                  if v.loss == "per_loop" and "stable injection" in v.control), None)
    if not (g.normed and found):
        return extension(not_shown(text, "(not in the paper; Parcae, 2026)", "-",
                                    "a per-loop normed or stable-injection cell is absent"),
                          "drift")
    k, deep = g.cells[found].loops, sweep_depth(g.cells[found].sweep)
    tests = [g.test(f"its growth over {n} loops / {g.normed}'s", g.growth(found, at)
                    / g.growth(g.normed, at), below, 1.0, unit="ratio")
             for n, at in (("K", k), (str(deep), deep))]
    ours, base = g.mean(found, "norm"), g.mean(g.normed, "norm")
    value = (f"growth {g.growth_text([found, g.normed])}; final-loop mean norm "
             f"{ours[0]:,.1f} ({found}) vs {base[0]:,.1f} ({g.normed})")
    mags = []
    if g.controls:
        top = np.max(np.stack([g.growth(c, deep) for c in g.controls]), axis=0)
        mags = [g.test(f"its growth over {deep} loops / the largest control's",
                       g.growth(found, deep) / top, at_most, 1.0, unit="ratio")]
        value += f"; controls: growth {g.growth_text(g.controls)}"
    return extension(claim(
        text, "(not in the paper; Parcae, 2026: the contraction keeps the state from growing "
        "across loops)",
        f"s_K / s_1 and s_{deep} / s_1 of the stable-injection cell / the normed baseline's "
        f"< 1 (paired intervals); magnitude: its s_{deep} / s_1 / the largest of the paper's "
        "controls' <= 1", value, tests, mags, key="stable_injection",
        source="Parcae (Prairie, Novack, Berg-Kirkpatrick, Fu, 2026): A_bar = exp(-Delta A) "
        "with every entry in (0, 1)"), "drift")
