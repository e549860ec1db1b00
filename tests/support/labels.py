"""Reading labels off an analysis: `learned_labels(analysis)` is every learned-behaviour detector
(`LEARNED`: those the registry marks `learned`) that any head passes, from the `labels` column,
which lists them all (a head's one `label` names only the strongest)."""
from headscope import detectors

LEARNED = sorted(name for name, d in detectors.REGISTRY.items() if d.learned)


def learned_labels(analysis) -> set:
    """Every learned-behaviour detector any head passes (the `labels` column lists them all)."""
    passing = {name for cell in analysis.labels["labels"] for name in str(cell).split(";") if name}
    return {name for name in passing if name.split(":")[0] in LEARNED}
