"""The cell taxonomy: which comparison a cell belongs to and which recipe it trains
with, read from its config alone. The claims, the reports and the exit-runtime
benchmark group cells by it.
"""

from __future__ import annotations

from typing import Any

from loopscope.weights.config import CellConfig


def cell_group(cell: CellConfig) -> str:
    """Which group of paper A's comparisons a cell belongs to: the normed baseline, a
    scale-controlled variant (raw readout, norm penalty, inter-loop norm or stable
    injection), final-norm only, or a paper B backbone (sampled depth), which no paper A
    claim uses."""
    m, t = cell.model, cell.train
    if t.samples_depth:
        return "paper B backbone"
    if m.inter_loop_norm or t.norm_penalty > 0 or m.readout == "raw" or m.inject == "stable":
        return "scale-controlled"
    return "normed baseline" if m.readout == "normed" else "final-norm only"


def control(cell: CellConfig) -> str:
    """What controls a scale-controlled cell's recurrent scale, in paper A's words (""
    for any other cell): the claims name the controls a recipe group has."""
    m, t = cell.model, cell.train
    if cell_group(cell) != "scale-controlled":
        return ""
    return ", ".join(name for name, on in (("raw readout", m.readout == "raw"),
                                           ("norm penalty", t.norm_penalty > 0),
                                           ("inter-loop norm", m.inter_loop_norm),
                                           ("stable injection", m.inject == "stable"))
                     if on)


# Paper A's controls among its seven trained conditions (per recipe): the design rule's
# other options (normalization between loops) and later ones (stable injection) are not
PAPER_CONTROLS = ("raw readout", "norm penalty")


def paper_condition(cell: CellConfig) -> bool:
    """Whether a paper A cell is one of the paper's seven trained conditions (loss
    placement x readout, final-norm only, the norm penalty): no inter-loop norm, no
    re-injection or stable injection, a fixed depth. Its counted findings read only
    these; the other cells stand beside them in extensions."""
    m, t = cell.model, cell.train
    return (not t.samples_depth and not m.inter_loop_norm and m.inject == "none"
            and m.readout in ("normed", "raw", "final_norm"))


def recipe_group(cell: CellConfig) -> str:
    """The recipe group paper A's claims put a cell in, as a name: "reference" for paper
    A's reference architecture and init (the `ref_` cells: PyTorch's default init,
    SwiGLU, decay on every parameter), "ours" for any other."""
    m, t = cell.model, cell.train
    return ("reference" if m.init == "paper_a" and m.ffn == "swiglu" and t.decay_on == "all"
            else "ours")


def recipe(cell: CellConfig) -> str:
    """A label for a cell's training recipe: architecture and init (what paper A's
    reference code uses is named so), then the schedule (ours unless it is the
    reference's constant lr 3e-4 with AdamW betas 0.9/0.999). Paper A's cells are
    compared within one recipe."""
    m, t = cell.model, cell.train
    arch = ("paper A's reference architecture and init" if recipe_group(cell) == "reference"
            else "ours")
    arch += f" (init {m.init}, {m.ffn}, decay on {t.decay_on})"
    warm = f", warm-up {t.warmup_steps}" if t.warmup_steps else ""
    theirs = t.schedule == "constant" and t.lr == 3e-4 and tuple(t.betas) == (0.9, 0.999)
    return (f"{arch}; schedule {'paper A' if theirs else 'ours'} ({t.schedule} lr {t.lr:g}"
            f"{warm}, betas {t.betas[0]:g}/{t.betas[1]:g})")


# Paper A's training recipe where it is not ours (PAPERS.md, its reference code): the
# schedule, the AdamW betas and the batch at 44M
PAPER_A_SCHEDULE = {"schedule": "constant", "lr": 3e-4, "warmup_steps": 0,
                    "betas": (0.9, 0.999), "batch_size": 64}


def recipe_gaps(cell: CellConfig) -> list[str]:
    """What of paper A's training recipe (PAPER_A_SCHEDULE) a cell lacks, in words
    ([] where it has all of it); the corpus and the scale are the run's (claims.json's
    `scale`), not listed."""
    t, want = cell.train, PAPER_A_SCHEDULE
    found = []
    if (t.schedule, t.lr) != (want["schedule"], want["lr"]):
        found.append(f"{t.schedule} lr {t.lr:g}, not constant {want['lr']:g}")
    if t.warmup_steps:
        found.append(f"warm-up {t.warmup_steps} steps, not none")
    if tuple(t.betas) != want["betas"]:
        found.append(f"betas {t.betas[0]:g}/{t.betas[1]:g}, not 0.9/0.999")
    if t.batch_size != want["batch_size"]:
        found.append(f"batch {t.batch_size}, not {want['batch_size']}")
    return found


def mark_recipes(records: list[dict[str, Any]], configs: dict[str, CellConfig]) -> None:
    """Paper A's records told where the recipe decides: each record the parts of paper
    A's recipe its group's cells lack (`recipe_lacks`), and each finding whose verdict
    differs between the two recipe groups marked on both (`recipe_turns`: each group's
    verdict) and said in its value. A paper mechanism would not turn with the recipe."""
    gaps = {facts(c)["recipe_group"]: recipe_gaps(c) for c in configs.values()
            if cell_group(c) != "paper B backbone"}
    by_key: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        r["recipe_lacks"] = gaps.get(r["group"], [])
        if r["kind"] == "finding" and r["verdict"] != "not shown":
            by_key.setdefault(r["key"], {})[r["group"]] = r
    for rows in by_key.values():
        seen = {g: r["verdict"] for g, r in rows.items()}
        if len(set(seen.values())) > 1:
            for r in rows.values():
                r["recipe_turns"] = seen
                r["value"] += ("; the recipe turns this row: " + ", ".join(
                    f"{v} in {g}" for g, v in seen.items())
                    + " (the reference group has paper A's architecture and init; of its "
                    "training recipe it lacks: "
                    + ("; ".join(gaps.get("reference", [])) or "nothing") + ")")


def paper_b_backbones(configs: dict[str, CellConfig]) -> tuple[str | None, str | None]:
    """(main, second) of the paper B backbones: the one with the largest evaluation
    depth R (model.loops; paper B's main setting, mean 8) and the one with the smallest
    other R (its saturation test, mean 4); None where absent. The training mean follows
    R (depth_mean), so this is also the order of the training means."""
    by_depth = sorted(configs, key=lambda c: configs[c].model.loops)
    if not by_depth:
        return None, None
    main, second = by_depth[-1], by_depth[0]
    return main, second if configs[second].model.loops != configs[main].model.loops else None


def facts(cell: CellConfig) -> dict[str, object]:
    """A cell's taxonomy as data, for every reader of tables/claims.json: its group,
    control, recipe group and label, loss placement, readout, depth R, width, seeds."""
    return {"group": cell_group(cell), "control": control(cell),
            "paper_condition": paper_condition(cell),
            "recipe_group": recipe_group(cell), "recipe": recipe(cell),
            "loss": cell.train.loss, "readout": cell.model.readout, "r": cell.model.loops,
            "d_model": cell.model.d_model, "seeds": list(cell.seeds)}


def training_precision(configs: dict[str, CellConfig]) -> str:
    """The precision the cells trained in (configure resolves auto), e.g. "fp32" or
    "bf16 (backbone, backbone_mean4), fp32 (the other 8)"; measurements are fp32
    whatever training was, which the provenance of every result says beside it."""
    by: dict[str, list[str]] = {}
    for name, cell in sorted(configs.items()):
        by.setdefault(cell.train.precision, []).append(name)
    if len(by) <= 1:
        return next(iter(by), "unknown (no configs/)")
    rest = max(by, key=lambda p: len(by[p]))
    named = [f"{p} ({', '.join(c)})" for p, c in by.items() if p != rest]
    return ", ".join(named) + f", {rest} (the other {len(by[rest])})"
